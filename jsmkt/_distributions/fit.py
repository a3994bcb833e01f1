"""Fitting PH distributions (stub, being written)."""


def fit_ph2_three_moments(m1, m2, m3, *, clip=False):
    raise NotImplementedError
