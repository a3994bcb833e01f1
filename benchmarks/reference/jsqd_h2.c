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
 * SELECT = exact (optional last argument) replaces uniformisation by an exact event selection without self-loops,
 * to measure what they cost: the total rate N lam + n_1 mu_1 + n_2 mu_2 follows the number n_i of servers busy in
 * each phase, an event is an arrival or a completion in phase i in proportion to these rates, and the completing
 * server is drawn uniformly among those busy in phase i by rejection (about N / n_i draws of a random server).
 *
 * SELECT = fcfs is the algorithm of jsmkt's general-service engine instead: each job's completion time is fixed
 * when it arrives (FCFS: it starts at the later of its arrival and the completion of the job ahead; its phase and
 * service time are drawn then), and a server is brought up to date only when an arrival samples it (its due
 * completions are applied first), the others at the end. Only arrivals and completions are events, and no event
 * looks at more than the d sampled servers.
 *
 * Build: cc -O2 -march=native -o jsqd_h2 jsqd_h2.c -lm
 * Run:   ./jsqd_h2 N LAM D SCV T_END WARMUP SEED MAX_QUEUE [uniform|exact|fcfs]
 * Prints one line: events, wall seconds of the event loop, mean queue length, mean sojourn time, refused arrivals.
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
#define M 2 /* service phases */

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

typedef struct {
    int n, d, q;
    double lam, p1, rates[M], warmup;
    int *k, *phase, *head;  /* per server: jobs, phase of the job in service (0 when idle), ring-buffer head */
    double *ring, *acc;     /* arrival times (n x q); per cell k * M + phase: time-integral corrections */
    double *comp;           /* fcfs: completion times (n x q) */
    int *jph;               /* fcfs: phases of the queued jobs (n x q) */
    long *count, *hist;     /* servers per cell; sojourn-time histogram */
    long busy[M];           /* servers busy in each phase */
    double soj_sum;
    long events, n_jobs, overflow;
} Sim;

/* Server s moved from cell cf to cell ct at time t. Integral of a cell's count over [warmup, t_end]: count(t_end)
 * (t_end - warmup) minus, for each change after the warm-up, the change times (t - warmup). */
static inline void move(Sim *S, int cf, int ct, double t) {
    const double w = t > S->warmup ? t - S->warmup : 0.0;
    S->acc[cf] += w;
    S->acc[ct] -= w;
    S->count[cf]--;
    S->count[ct]++;
}

static inline int new_phase(const Sim *S, uint64_t base) { return uniform(splitmix(base + 4 * GAMMA)) < S->p1 ? 0 : 1; }

/* An arrival at time t: the first of the shortest of d sampled servers joins, unless its buffer is full. */
static inline void arrive(Sim *S, uint64_t base, double t) {
    int s = (int)(uniform(splitmix(base + 5 * GAMMA)) * S->n);
    for (int j = 1; j < S->d; j++) {
        const int c = (int)(uniform(splitmix(base + (5 + j) * GAMMA)) * S->n);
        if (S->k[c] < S->k[s]) s = c;
    }
    const int kk = S->k[s];
    if (kk == S->q) { S->overflow++; return; }
    int slot = S->head[s] + kk;
    if (slot >= S->q) slot -= S->q;
    S->ring[(size_t)s * S->q + slot] = t;
    if (kk == 0) { S->phase[s] = new_phase(S, base); S->busy[S->phase[s]]++; }
    S->k[s] = kk + 1;
    move(S, kk * M + S->phase[s], (kk + 1) * M + S->phase[s], t);
}

/* A job leaves at time t after sojourn soj: counted after the warm-up (sum and log-linear histogram). */
static inline void record_sojourn(Sim *S, double soj, double t) {
    if (t <= S->warmup) return;
    const int64_t hist_lo = (int64_t)0x3F0 << HIST_SUB_BITS;  /* 2^-15 */
    S->soj_sum += soj;
    S->n_jobs++;
    int64_t bits;
    memcpy(&bits, &soj, sizeof bits);
    const int64_t bin = (bits >> (52 - HIST_SUB_BITS)) - hist_lo + 1;
    S->hist[bin < 0 ? 0 : bin > HIST_BINS + 1 ? HIST_BINS + 1 : bin]++;
}

/* Busy server s completes its job at time t (H2 phases only complete). */
static inline void depart(Sim *S, uint64_t base, int s, double t) {
    const int kk = S->k[s], p = S->phase[s];
    const double soj = t - S->ring[(size_t)s * S->q + S->head[s]];
    record_sojourn(S, soj, t);
    S->head[s] = S->head[s] + 1 == S->q ? 0 : S->head[s] + 1;
    S->k[s] = kk - 1;
    S->busy[p]--;
    S->phase[s] = kk > 1 ? new_phase(S, base) : 0;
    if (kk > 1) S->busy[S->phase[s]]++;
    move(S, kk * M + p, (kk - 1) * M + S->phase[s], t);
}

/* jsmkt's algorithm: uniformisation at rate N (lam + qbar), self-loops included. */
static void run_uniform(Sim *S, uint64_t seed, double t_end) {
    const int words = 4 + S->d;
    const double qbar = S->rates[0] > S->rates[1] ? S->rates[0] : S->rates[1];
    const double total_rate = S->n * (S->lam + qbar), p_arr = S->lam / (S->lam + qbar);
    const double p_done[M] = {S->rates[0] / qbar, S->rates[1] / qbar};
    double t = 0.0;
    for (uint64_t ctr = 0;; ctr++) {
        const uint64_t base = seed + ctr * (uint64_t)words * GAMMA;
        const double tau = t - log(uniform(splitmix(base + GAMMA))) / total_rate;
        if (tau > t_end) break;
        t = tau;
        S->events++;
        if (uniform(splitmix(base + 2 * GAMMA)) < p_arr) {
            arrive(S, base, t);
        } else {
            const int s = (int)(uniform(splitmix(base + 5 * GAMMA)) * S->n);
            if (S->k[s] > 0 && uniform(splitmix(base + 3 * GAMMA)) < p_done[S->phase[s]]) depart(S, base, s, t);
        }
    }
}

/* Exact event selection: no self-loops; the completing server is drawn among those busy in its phase. */
static void run_exact(Sim *S, uint64_t seed, double t_end) {
    const int words = 4 + S->d;
    const double arr_rate = S->n * S->lam;
    double t = 0.0;
    for (uint64_t ctr = 0;; ctr++) {
        const uint64_t base = seed + ctr * (uint64_t)words * GAMMA;
        const double r0 = S->busy[0] * S->rates[0], total = arr_rate + r0 + S->busy[1] * S->rates[1];
        const double tau = t - log(uniform(splitmix(base + GAMMA))) / total;
        if (tau > t_end) break;
        t = tau;
        S->events++;
        const double u = uniform(splitmix(base + 2 * GAMMA)) * total;
        if (u < arr_rate || S->busy[0] + S->busy[1] == 0) {
            arrive(S, base, t);
        } else {
            const int p = (u < arr_rate + r0 && S->busy[0] > 0) || S->busy[1] == 0 ? 0 : 1;
            uint64_t w = base + 3 * GAMMA;
            int s;
            do {
                w += 0x632BE59BD9B4E019ULL;  /* a stream of words of its own for the draws of this event */
                s = (int)(uniform(splitmix(w)) * S->n);
            } while (!(S->k[s] > 0 && S->phase[s] == p));
            depart(S, base, s, t);
        }
    }
}

/* fcfs: apply the completions of server s up to time t (their times are fixed already). */
static inline void catch_up(Sim *S, int s, double t) {
    int kk = S->k[s];
    while (kk > 0) {
        const size_t i = (size_t)s * S->q + S->head[s];
        const double e = S->comp[i];
        if (e > t) break;
        const double soj = e - S->ring[i];
        record_sojourn(S, soj, e);
        const int p = S->jph[i];
        S->head[s] = S->head[s] + 1 == S->q ? 0 : S->head[s] + 1;
        const int np = kk > 1 ? S->jph[(size_t)s * S->q + S->head[s]] : 0;
        move(S, kk * M + p, (kk - 1) * M + np, e);
        S->events++;
        kk--;
    }
    S->k[s] = kk;
}

/* jsmkt's general-service algorithm: completion times fixed at arrival, servers brought up to date when sampled. */
static void run_fcfs(Sim *S, uint64_t seed, double t_end) {
    const int words = 4 + S->d;
    double t = 0.0;
    for (uint64_t ctr = 0;; ctr++) {
        const uint64_t base = seed + ctr * (uint64_t)words * GAMMA;
        t -= log(uniform(splitmix(base + GAMMA))) / (S->n * S->lam);
        if (t > t_end) break;
        int s = (int)(uniform(splitmix(base + 5 * GAMMA)) * S->n);
        catch_up(S, s, t);
        for (int j = 1; j < S->d; j++) {
            const int c = (int)(uniform(splitmix(base + (5 + j) * GAMMA)) * S->n);
            catch_up(S, c, t);
            if (S->k[c] < S->k[s]) s = c;
        }
        S->events++;
        const int kk = S->k[s];
        if (kk == S->q) { S->overflow++; continue; }
        const int p = new_phase(S, base);
        const size_t row = (size_t)s * S->q;
        int slot = S->head[s] + kk;
        if (slot >= S->q) slot -= S->q;
        const double start = kk > 0 ? S->comp[row + (slot == 0 ? S->q - 1 : slot - 1)] : t;
        S->comp[row + slot] = start - log(uniform(splitmix(base + 3 * GAMMA))) / S->rates[p];
        S->ring[row + slot] = t;
        S->jph[row + slot] = p;
        const int cp = kk > 0 ? S->jph[row + S->head[s]] : p;  /* phase of the job in service after the arrival */
        move(S, kk * M + (kk > 0 ? cp : 0), (kk + 1) * M + cp, t);
        S->k[s] = kk + 1;
    }
    for (int s = 0; s < S->n; s++) catch_up(S, s, t_end);
}

int main(int argc, char **argv) {
    if (argc != 9 && argc != 10) {
        fprintf(stderr, "usage: %s N LAM D SCV T_END WARMUP SEED MAX_QUEUE [uniform|exact|fcfs]\n", argv[0]);
        return 2;
    }
    const int n = atoi(argv[1]), d = atoi(argv[3]), q = atoi(argv[8]);
    const double lam = atof(argv[2]), scv = atof(argv[4]), t_end = atof(argv[5]), warmup = atof(argv[6]);
    const uint64_t seed = strtoull(argv[7], NULL, 10) * GAMMA + 1;
    const char *select = argc == 10 ? argv[9] : "uniform";
    const int exact = strcmp(select, "exact") == 0, fcfs = strcmp(select, "fcfs") == 0;
    const char *bad = n < 1 ? "N must be >= 1" : d < 1 ? "D must be >= 1" : q < 1 ? "MAX_QUEUE must be >= 1"
                    : !(lam > 0) ? "LAM must be > 0" : !(scv > 1) ? "SCV must be > 1 (H2 service)"
                    : !(warmup >= 0) ? "WARMUP must be >= 0" : !(t_end > warmup) ? "T_END must exceed WARMUP"
                    : !exact && !fcfs && strcmp(select, "uniform") ? "SELECT must be uniform, exact or fcfs" : NULL;
    if (bad) {
        fprintf(stderr, "bad arguments: %s (got N=%s LAM=%s D=%s SCV=%s T_END=%s WARMUP=%s MAX_QUEUE=%s SELECT=%s)\n",
                bad, argv[1], argv[2], argv[3], argv[4], argv[5], argv[6], argv[8], select);
        return 2;
    }
    const int n_cells = (q + 1) * M;
    const double p1 = 0.5 * (1.0 + sqrt((scv - 1.0) / (scv + 1.0)));
    Sim S = {.n = n, .d = d, .q = q, .lam = lam, .p1 = p1, .rates = {2.0 * p1, 2.0 * (1.0 - p1)}, .warmup = warmup};
    S.k = calloc(n, sizeof *S.k), S.phase = calloc(n, sizeof *S.phase), S.head = calloc(n, sizeof *S.head);
    S.ring = calloc((size_t)n * q, sizeof *S.ring), S.acc = calloc(n_cells, sizeof *S.acc);
    S.count = calloc(n_cells, sizeof *S.count), S.hist = calloc(HIST_BINS + 2, sizeof *S.hist);
    if (fcfs) S.comp = calloc((size_t)n * q, sizeof *S.comp), S.jph = calloc((size_t)n * q, sizeof *S.jph);
    if (!S.k || !S.phase || !S.head || !S.ring || !S.acc || !S.count || !S.hist || (fcfs && (!S.comp || !S.jph)))
        return 1;
    S.count[0] = n;

    const double start = now();
    if (fcfs)
        run_fcfs(&S, seed, t_end);
    else if (exact)
        run_exact(&S, seed, t_end);
    else
        run_uniform(&S, seed, t_end);
    const double wall = now() - start;
    double queue = 0.0;
    for (int c = 0; c < n_cells; c++) queue += (c / M) * (S.count[c] * (t_end - warmup) + S.acc[c]);
    printf("%ld %.6f %.6f %.6f %ld\n", S.events, wall, queue / (n * (t_end - warmup)),
           S.soj_sum / (S.n_jobs > 0 ? S.n_jobs : 1), S.overflow);
    return 0;
}
