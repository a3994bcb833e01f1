/* Native reference for benchmarks/simulate.py: jsmkt's uniformised PH event engine, written as a plain C loop.
 *
 * The same system and the same algorithm as jsmkt's sequential PH engine (jsmkt/_simulate/core.py): JSQ(d), N
 * servers, Poisson arrivals of rate N * lam, d servers sampled with replacement, the first of the shortest joined;
 * FCFS with a ring buffer of arrival times per server; balanced-means H2 service (mean 1, SCV scv), simulated by
 * uniformisation at rate N (lam + qbar), qbar the largest phase rate, self-loops included; counter-based SplitMix64
 * random words, one block per event. Statistics as in jsmkt: time integrals of the number of servers in each
 * (queue length, phase) cell over [warmup, t_end], per-job sojourn times (sum and a log-linear histogram), event
 * count. It shows how fast this algorithm can run on the machine, not a model of its own: the benchmark prints it
 * beside jsmkt and the plain-Python loop.
 *
 * Build: cc -O2 -march=native -o jsqd_h2 jsqd_h2.c -lm
 * Run:   ./jsqd_h2 N LAM D SCV T_END WARMUP SEED MAX_QUEUE
 * Prints one line: events, wall seconds of the event loop, mean queue length, mean sojourn time.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GAMMA 0x9E3779B97F4A7C15ULL
#define HIST_SUB_BITS 8
#define HIST_BINS 4096

static inline uint64_t splitmix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline double uniform(uint64_t w) { return ((double)(w >> 11) + 0.5) * 0x1p-53; }

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: %s N LAM D SCV T_END WARMUP SEED MAX_QUEUE\n", argv[0]);
        return 2;
    }
    const int n = atoi(argv[1]), d = atoi(argv[3]), q = atoi(argv[8]);
    const double lam = atof(argv[2]), scv = atof(argv[4]), t_end = atof(argv[5]), warmup = atof(argv[6]);
    const uint64_t seed = strtoull(argv[7], NULL, 10) * GAMMA + 1;
    const char *bad = n < 1 ? "N must be >= 1" : d < 1 ? "D must be >= 1" : q < 1 ? "MAX_QUEUE must be >= 1"
                    : !(lam > 0) ? "LAM must be > 0" : !(scv > 1) ? "SCV must be > 1 (H2 service)"
                    : !(warmup >= 0) ? "WARMUP must be >= 0" : !(t_end > warmup) ? "T_END must exceed WARMUP" : NULL;
    if (bad) {
        fprintf(stderr, "bad arguments: %s (got N=%s LAM=%s D=%s SCV=%s T_END=%s WARMUP=%s MAX_QUEUE=%s)\n", bad,
                argv[1], argv[2], argv[3], argv[4], argv[5], argv[6], argv[8]);
        return 2;
    }
    const int m = 2, words = 4 + d, n_cells = (q + 1) * m;
    const double p1 = 0.5 * (1.0 + sqrt((scv - 1.0) / (scv + 1.0)));
    const double rates[2] = {2.0 * p1, 2.0 * (1.0 - p1)};
    const double qbar = rates[0] > rates[1] ? rates[0] : rates[1];
    const double total_rate = n * (lam + qbar), p_arr = lam / (lam + qbar);
    const double p_done[2] = {rates[0] / qbar, rates[1] / qbar};

    int *k = calloc(n, sizeof *k), *phase = calloc(n, sizeof *phase), *head = calloc(n, sizeof *head);
    double *ring = calloc((size_t)n * q, sizeof *ring), *acc = calloc(n_cells, sizeof *acc);
    long *count = calloc(n_cells, sizeof *count), *hist = calloc(HIST_BINS + 2, sizeof *hist);
    if (!k || !phase || !head || !ring || !acc || !count || !hist) return 1;
    count[0] = n;

    double t = 0.0, soj_sum = 0.0;
    long events = 0, n_jobs = 0, overflow = 0;
    uint64_t ctr = 0;
    const int64_t hist_lo = (int64_t)0x3F0 << HIST_SUB_BITS;  /* 2^-15 */
    double start = now();
    for (;;) {
        const uint64_t base = seed + ctr * (uint64_t)words * GAMMA;
        ctr++;
        const double tau = t - log(uniform(splitmix(base + GAMMA))) / total_rate;
        if (tau > t_end) break;
        t = tau;
        events++;
        const int is_arr = uniform(splitmix(base + 2 * GAMMA)) < p_arr;
        int s = (int)(uniform(splitmix(base + 5 * GAMMA)) * n);
        int cf, ct;
        if (is_arr) {
            for (int j = 1; j < d; j++) {
                const int c = (int)(uniform(splitmix(base + (5 + j) * GAMMA)) * n);
                if (k[c] < k[s]) s = c;
            }
            const int kk = k[s];
            if (kk == q) { overflow++; continue; }
            int slot = head[s] + kk;
            if (slot >= q) slot -= q;
            ring[(size_t)s * q + slot] = t;
            if (kk == 0) phase[s] = uniform(splitmix(base + 4 * GAMMA)) < p1 ? 0 : 1;
            cf = kk * m + phase[s];  /* phase 0 when idle */
            k[s] = kk + 1;
            ct = (kk + 1) * m + phase[s];
        } else {
            const int kk = k[s];
            if (kk == 0) continue;
            const int p = phase[s];
            if (uniform(splitmix(base + 3 * GAMMA)) >= p_done[p]) continue;  /* H2 phases only complete */
            const double soj = t - ring[(size_t)s * q + head[s]];
            if (t > warmup) {
                soj_sum += soj;
                n_jobs++;
                int64_t bits;
                memcpy(&bits, &soj, sizeof bits);
                int64_t bin = (bits >> (52 - HIST_SUB_BITS)) - hist_lo + 1;
                hist[bin < 0 ? 0 : bin > HIST_BINS + 1 ? HIST_BINS + 1 : bin]++;
            }
            head[s] = head[s] + 1 == q ? 0 : head[s] + 1;
            k[s] = kk - 1;
            phase[s] = kk > 1 ? (uniform(splitmix(base + 4 * GAMMA)) < p1 ? 0 : 1) : 0;
            cf = kk * m + p;
            ct = (kk - 1) * m + phase[s];
        }
        /* Integral of a cell's count over [warmup, t_end]: count(t_end) (t_end - warmup) minus, for each change
         * after the warm-up, the change times (tau - warmup). */
        const double w = t > warmup ? t - warmup : 0.0;
        acc[cf] += w;
        acc[ct] -= w;
        count[cf]--;
        count[ct]++;
    }
    const double wall = now() - start;
    double queue = 0.0;
    for (int c = 0; c < n_cells; c++) queue += (c / m) * (count[c] * (t_end - warmup) + acc[c]);
    printf("%ld %.6f %.6f %.6f %ld\n", events, wall, queue / (n * (t_end - warmup)),
           soj_sum / (n_jobs > 0 ? n_jobs : 1), overflow);
    return 0;
}
