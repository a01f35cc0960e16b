/* The breakdown's cover-pattern sweep in one pass (analyzers/intervals.py,
 * pattern_table): the same arithmetic as the numpy path, in the same order,
 * so the table is bit for bit the same. Built and loaded by
 * analyzers/native.py; the numpy path is used where it cannot be. */
#include <stdint.h>

/* Boundaries in time order: order[i] < n is the start of interval order[i],
 * else the end of interval order[i] - n (a stable argsort of the starts then
 * the ends: at one instant starts come before ends). lab[j] is interval j's
 * set: 0 a window, 1..n_sets a member of set lab[j]. After every boundary of
 * one instant, the segment up to the next instant is added to
 * table[row * 2^n_sets + pattern] when a window is open: row is the number
 * of window starts seen so far minus one, pattern's bit f-1 is set while set
 * f has an open interval. Returns 0, or -1 when a label is out of range. */
int commprof_pattern_sweep(const int64_t *starts, const int64_t *ends, const int8_t *lab, int64_t n,
                           const int64_t *order, int n_sets, double *table, int64_t n_win)
{
    int64_t counts[64] = {0};
    int64_t n2 = 2 * n, row = -1, pattern = 0;
    const int64_t n_pat = (int64_t)1 << n_sets;
    if (n_sets < 0 || n_sets > 30)
        return -1;
    for (int64_t i = 0; i < n2; i++) {
        int64_t j = order[i], t;
        int f;
        if (j < n) {
            t = starts[j];
            f = lab[j];
            if (f < 0 || f > n_sets)
                return -1;
            counts[f]++;
            if (f == 0)
                row++;
        } else {
            t = ends[j - n];
            f = lab[j - n];
            if (f < 0 || f > n_sets)
                return -1;
            counts[f]--;
        }
        if (f > 0) {
            if (counts[f] > 0)
                pattern |= (int64_t)1 << (f - 1);
            else
                pattern &= ~((int64_t)1 << (f - 1));
        }
        if (i + 1 < n2 && counts[0] > 0 && row >= 0 && row < n_win) {
            int64_t k = order[i + 1];
            int64_t t2 = k < n ? starts[k] : ends[k - n];
            if (t2 != t)
                table[row * n_pat + pattern] += (double)(t2 - t);
        }
    }
    return 0;
}
