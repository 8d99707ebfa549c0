/* The cost of an exit hook from C (benches/exit_hook_c.sh builds this at
 * -O0 and -O2 against target/release/libcallstack.a): per row, one call of
 * a noinline function returning a value, timed in batches of BATCH calls;
 * the rows take turns for ROUNDS rounds (so that load changes hit every row
 * alike) and each row's median batch is printed, in ns per call.
 *   plain call                 the function alone
 *   install + hooked return    it installs an empty hook on its own frame
 *                              (depth 0), then returns through the
 *                              trampoline, which runs the hook
 * and the same two called 16 frames deep. */
#include <callstack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NOINLINE __attribute__((noinline))
#define BATCH 200
#define ROUNDS 2000

static volatile long sink;
static long hits;

static void empty_hook(void *arg) {
    (void)arg;
    hits++;
}

NOINLINE long plain(long x) {
    sink = x;
    return x + 1;
}

NOINLINE long hooked(long x) {
    if (callstack_exit_hook_install(0, empty_hook, 0) != 0) abort();
    sink = x;
    return x + 1;
}

NOINLINE long deep(int n, long (*f)(long)) {
    if (n == 0) return f(1);
    return deep(n - 1, f) + 1;
}

static long row_plain(void) { return plain(1); }
static long row_hooked(void) { return hooked(1); }
static long row_plain_deep(void) { return deep(16, plain); }
static long row_hooked_deep(void) { return deep(16, hooked); }

static const struct {
    const char *name;
    long (*f)(void);
} rows[] = {
    {"plain call", row_plain},
    {"install + hooked return", row_hooked},
    {"plain call, 16 deep", row_plain_deep},
    {"install + hooked return, 16 deep", row_hooked_deep},
};
#define NROWS (int)(sizeof rows / sizeof rows[0])

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double samples[NROWS][ROUNDS];

int main(int argc, char **argv) {
    const char *label = argc > 1 ? argv[1] : "C";
    for (int i = 0; i < NROWS; i++) /* warm up: the rule cache, the table */
        for (int k = 0; k < 10000; k++) rows[i].f();
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < NROWS; i++) {
            double t = now_ns();
            for (int k = 0; k < BATCH; k++) rows[i].f();
            samples[i][r] = (now_ns() - t) / BATCH;
        }
    double med[NROWS];
    for (int i = 0; i < NROWS; i++) {
        qsort(samples[i], ROUNDS, sizeof(double), cmp);
        med[i] = samples[i][ROUNDS / 2];
    }
    for (int i = 0; i < NROWS; i++) {
        double base = i < 2 ? med[0] : med[2];
        if (i % 2)
            printf("| %s | %s | %.1f | %.1f |\n", label, rows[i].name, med[i], med[i] - base);
        else
            printf("| %s | %s | %.1f | |\n", label, rows[i].name, med[i]);
    }
    if (hits == 0) return 1;
    return 0;
}
