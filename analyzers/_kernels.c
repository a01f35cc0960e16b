/* The analyzers' compiled kernels, each the same arithmetic as the numpy
 * path it replaces, so the results are bit for bit the same: the
 * breakdown's cover-pattern sweep, as a table or straight into weighted
 * figures (analyzers/intervals.py, pattern_table), its per-rank time lines
 * (analyzers/breakdown.py, _rank_keys), both at once for a chunk whose
 * ranks come in runs (breakdown.py, _step_sweep_compiled), the sweep's row masks
 * (analyzers/run.py, _event_masks), and the collectives' per-instance
 * reduction (analyzers/collectives.py, _reduce_instances; of a chunk's
 * rank runs without a sort, _reduce_runs; sums per key, _sums_per_key), and
 * the straggler tests' order statistics (analyzers/stragglers.py,
 * others_median and column_kth). Built and loaded by analyzers/native.py;
 * the numpy paths are used where it cannot be. */
#include <stdint.h>

/* One boundary of the cover-pattern sweeps: interval of set f (0: a
 * window) starts (start != 0) or ends; counts[f] open intervals per set,
 * *row the window starts seen minus one, *pattern bit f-1 set while set f
 * has an open interval. Returns -1 when f is out of range. */
static int boundary(int64_t *counts, int64_t *row, int64_t *pattern, int f, int n_sets, int start)
{
    if (f < 0 || f > n_sets)
        return -1;
    if (start) {
        counts[f]++;
        if (f == 0)
            (*row)++;
    } else {
        counts[f]--;
    }
    if (f > 0) {
        if (counts[f] > 0)
            *pattern |= (int64_t)1 << (f - 1);
        else
            *pattern &= ~((int64_t)1 << (f - 1));
    }
    return 0;
}

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
    if (n_sets < 0 || n_sets > 30)
        return -1;
    const int64_t n_pat = (int64_t)1 << n_sets;
    for (int64_t i = 0; i < n2; i++) {
        int64_t j = order[i], t = j < n ? starts[j] : ends[j - n];
        if (boundary(counts, &row, &pattern, lab[j < n ? j : j - n], n_sets, j < n))
            return -1;
        if (i + 1 < n2 && counts[0] > 0 && row >= 0 && row < n_win) {
            int64_t k = order[i + 1];
            int64_t t2 = k < n ? starts[k] : ends[k - n];
            if (t2 != t)
                table[row * n_pat + pattern] += (double)(t2 - t);
        }
    }
    return 0;
}

/* Per cover pattern of n_sets sets, the figures (of m) it adds to, bit j
 * for figure j, from weights (2^n_sets rows of m values). Returns 0, or -1
 * when n_sets or m is out of range or a weight is not 0 or 1. */
static int weight_columns(int n_sets, const double *weights, int m, uint32_t *cols)
{
    if (n_sets < 0 || n_sets > 12 || m < 0 || m > 32)
        return -1;
    const int64_t n_pat = (int64_t)1 << n_sets;
    for (int64_t p = 0; p < n_pat; p++) {
        cols[p] = 0;
        for (int j = 0; j < m; j++) {
            double w = weights[p * m + j];
            if (w == 1.0)
                cols[p] |= (uint32_t)1 << j;
            else if (w != 0.0)
                return -1;
        }
    }
    return 0;
}

/* len added to the figures o[col] whose bit col is set in c. */
static inline void add_to_figures(double *o, uint32_t c, double len)
{
    for (int col = 0; c; col++, c >>= 1)
        if (c & 1)
            o[col] += len;
}

/* The weighted sweep's merge of n intervals' starts and ends (order_s,
 * order_e: each a stable argsort; starts first at one instant): after each
 * boundary, the segment to the next instant is added to the figures
 * (out[row * m ..], as cols gives them) of the window open then. An
 * interval whose label is not 0..n_sets, or that does not end after it
 * starts, is passed over (check_len: whether the caller's labels leave
 * the second test to this merge). Windows are numbered on from row (the last one
 * before these intervals; -1: none); win_rows, where given, gets each
 * window's interval index plus base. Returns the last window's row, or -2
 * when a window would pass n_win. */
static inline int64_t merge_sweep(const int64_t *s, const int64_t *e, const int8_t *lab, int64_t n,
                                  const int64_t *order_s, const int64_t *order_e, int n_sets, const uint32_t *cols,
                                  int m, double *out, int64_t row, int64_t n_win, int64_t *win_rows, int64_t base,
                                  int check_len)
{
    int64_t counts[64] = {0};
    int64_t pattern = 0, a = 0, b = 0;
    while (a < n || b < n) {
        int start = a < n && (b >= n || s[order_s[a]] <= e[order_e[b]]);
        int64_t j = start ? order_s[a++] : order_e[b++];
        int64_t t = start ? s[j] : e[j];
        if (lab[j] >= 0 && lab[j] <= n_sets && (!check_len || e[j] > s[j])) {
            if (start && lab[j] == 0) {
                if (row + 1 >= n_win)
                    return -2;
                if (win_rows)
                    win_rows[row + 1] = base + j;
            }
            boundary(counts, &row, &pattern, lab[j], n_sets, start);
        }
        if ((a < n || b < n) && counts[0] > 0 && row >= 0) {
            int64_t t2;
            if (a < n && b < n) {
                int64_t x = s[order_s[a]], y = e[order_e[b]];
                t2 = x <= y ? x : y;
            } else {
                t2 = a < n ? s[order_s[a]] : e[order_e[b]];
            }
            if (t2 != t)
                add_to_figures(out + row * m, cols[pattern], (double)(t2 - t));
        }
    }
    return row;
}

/* merge_sweep's figures for at most 6 sets, the same sums: a window's
 * segments summed per cover pattern (int64 ns), then added to its figures
 * once, as the window closes (the next window starts, or the boundaries
 * end). Every term is a whole number of ns below 2^53, so each figure's sum
 * is exact either way and the doubles are the same bit for bit. Without a
 * branch on the times: the next start and the next end kept at hand, the
 * boundary taken, the counts, pattern and segment updated by selection
 * (which of a start or an end comes next is a coin toss to the branch
 * predictor). A segment of no length adds 0 to its pattern, and +0.0 to
 * figures that only ever grow from +0.0: the same bits. */
static void flush_window(double *o, const uint32_t *cols, int64_t *acc, uint64_t *seen)
{
    for (uint64_t left = *seen; left; left &= left - 1) {
        int p = __builtin_ctzll(left);
        add_to_figures(o, cols[p], (double)acc[p]);
        acc[p] = 0;
    }
    *seen = 0;
}

static inline int64_t merge_sweep_runs(const int64_t *s, const int64_t *e, const int8_t *lab, int64_t n,
                                       const int64_t *order_s, const int64_t *order_e, int n_sets,
                                       const uint32_t *cols, int m, double *out, int64_t row, int64_t n_win,
                                       int64_t *win_rows, int64_t base)
{
    int64_t counts[8] = {0};
    int64_t acc[64] = {0};
    uint64_t seen = 0;
    int64_t pattern = 0, a = 0, b = 0;
    if (n <= 0)
        return row;
    int64_t ns = s[order_s[0]], ne = e[order_e[0]];
    while (a < n || b < n) {
        int start = a < n && (b >= n || ns <= ne);
        int64_t j = start ? order_s[a] : order_e[b];
        int64_t t = start ? ns : ne;
        a += start;
        b += !start;
        int64_t ns2 = s[order_s[a < n ? a : n - 1]], ne2 = e[order_e[b < n ? b : n - 1]];
        ns = a < n ? ns2 : ns;
        ne = b < n ? ne2 : ne;
        int f = lab[j];
        if (f >= 0 && f <= n_sets) {
            if (f == 0 && start) {
                if (row + 1 >= n_win)
                    return -2;
                if (win_rows)
                    win_rows[row + 1] = base + j;
                if (row >= 0 && seen)
                    flush_window(out + row * m, cols, acc, &seen);
                row++;
            }
            counts[f] += start ? 1 : -1;
            int64_t bit = f > 0 ? (int64_t)1 << (f - 1) : 0;
            pattern = (pattern & ~bit) | (counts[f] > 0 ? bit : 0);
        }
        int more = a < n || b < n;
        int64_t t2 = a < n && b < n ? (ns <= ne ? ns : ne) : (a < n ? ns : ne);
        int64_t len = more && counts[0] > 0 && row >= 0 ? t2 - t : 0;
        acc[pattern] += len;
        seen |= (uint64_t)(len != 0) << pattern;
    }
    if (row >= 0 && seen)
        flush_window(out + row * m, cols, acc, &seen);
    return row;
}

/* commprof_pattern_sweep's segments, each added at once to the m columns
 * of out[row * m ..] whose weight for its pattern is 1 (weights: 2^n_sets
 * rows of m values, each 0 or 1), instead of to a 2^n_sets-wide table then
 * multiplied: a quarter of the memory touched for 5 sets and 8 columns, and
 * no product. The same sums: every term is a whole number of ns, so every
 * partial sum is exact (below 2^53 ns, 104 days a window) in any order.
 * The boundaries come as two stable argsorts, of the starts (order_s) and
 * of the ends (order_e), merged here starts first at one instant: the
 * order of commprof_pattern_sweep's, two sorts half the size. An interval
 * whose label is not 0..n_sets, or that does not end after it starts, is
 * passed over (both its boundaries: the state they would change stays, so
 * every segment adds up as without them), as pattern_table ignores it.
 * Returns 0, or -1 when n_sets, m or a weight is out of range. */
int commprof_pattern_weighted(const int64_t *starts, const int64_t *ends, const int8_t *lab, int64_t n,
                              const int64_t *order_s, const int64_t *order_e, int n_sets, const double *weights,
                              int m, double *out, int64_t n_win)
{
    uint32_t cols[1 << 12];
    if (weight_columns(n_sets, weights, m, cols))
        return -1;
    return merge_sweep(starts, ends, lab, n, order_s, order_e, n_sets, cols, m, out, -1, n_win, 0, 0, 1) < -1 ? -1 : 0;
}

/* The per-instance reduction of the collectives (analyzers/collectives.py,
 * _reduce_instances) over rows already in key order (order: a stable argsort
 * of key), every field but the summed completions (numpy sums those: its
 * summation order is kept). Fields in collectives._INST_FIELDS order; in[f]
 * and out[f] point to n int64 or float64 values (floats: sum_end, bytes,
 * min_bytes, gsize). Ties as the numpy path: the rank of an extreme is that
 * of the last sorted row holding it, the latest issuer the highest rank
 * holding the latest issue; a float extreme that is NaN (every row NaN)
 * takes sorted row 0's rank. (A float extreme among zeros of both signs may
 * keep the other zero than numpy's vectorised reduction: traces hold sizes
 * that are integers, never -0.) Writes one row per distinct key
 * (out[f][0..k)) and returns k. */
enum { F_KEY, F_OP, F_MIN_START, F_MAX_START, F_SUM_END, F_N, F_BYTES, F_LAST_RANK, F_OP_MAX, F_MIN_BYTES,
       F_MIN_BYTES_RANK, F_MAX_BYTES_RANK, F_GSIZE, F_SRC_MIN, F_SRC_MAX, F_SRC_MIN_RANK, F_SRC_MAX_RANK,
       F_DT_MIN, F_DT_MAX, F_DT_MIN_RANK, F_DT_MAX_RANK, N_FIELDS };

#define I64(f) ((const int64_t *)in[f])
#define F64(f) ((const double *)in[f])
#define O64(f) ((int64_t *)out[f])
#define OF64(f) ((double *)out[f])

static double fmax_nan(double a, double b) { return a != a ? b : (b != b ? a : (a >= b ? a : b)); }
static double fmin_nan(double a, double b) { return a != a ? b : (b != b ? a : (a <= b ? a : b)); }

int64_t commprof_reduce_instances(int64_t n, const int64_t *order, void **in, void **out)
{
    int64_t k = 0, s = 0;
    const int64_t *key = I64(F_KEY);
    while (s < n) {
        int64_t e = s + 1, key0 = key[order[s]];
        while (e < n && key[order[e]] == key0)
            e++;
        /* rows s..e-1 of the sorted order: one instance */
        int64_t j0 = order[s];
        int64_t op = I64(F_OP)[j0], op_max = I64(F_OP_MAX)[j0], mn = I64(F_MIN_START)[j0], top = I64(F_MAX_START)[j0];
        int64_t cnt = 0;
        double bytes = F64(F_BYTES)[j0], low = F64(F_MIN_BYTES)[j0], gs = F64(F_GSIZE)[j0];
        int64_t smin = I64(F_SRC_MIN)[j0], smax = I64(F_SRC_MAX)[j0], dmin = I64(F_DT_MIN)[j0], dmax = I64(F_DT_MAX)[j0];
        for (int64_t i = s; i < e; i++) {
            int64_t j = order[i];
            if (I64(F_OP)[j] < op) op = I64(F_OP)[j];
            if (I64(F_OP_MAX)[j] > op_max) op_max = I64(F_OP_MAX)[j];
            if (I64(F_MIN_START)[j] < mn) mn = I64(F_MIN_START)[j];
            if (I64(F_MAX_START)[j] > top) top = I64(F_MAX_START)[j];
            cnt += I64(F_N)[j];
            if (i > s) {
                bytes = fmax_nan(bytes, F64(F_BYTES)[j]);
                low = fmin_nan(low, F64(F_MIN_BYTES)[j]);
                gs = fmax_nan(gs, F64(F_GSIZE)[j]);
            }
            if (I64(F_SRC_MIN)[j] < smin) smin = I64(F_SRC_MIN)[j];
            if (I64(F_SRC_MAX)[j] > smax) smax = I64(F_SRC_MAX)[j];
            if (I64(F_DT_MIN)[j] < dmin) dmin = I64(F_DT_MIN)[j];
            if (I64(F_DT_MAX)[j] > dmax) dmax = I64(F_DT_MAX)[j];
        }
        /* who holds each extreme: the last sorted row (sorted row 0 when none does) */
        int64_t last_rank = INT64_MIN, at_max = -1, at_min = -1, a_smin = -1, a_smax = -1, a_dmin = -1, a_dmax = -1;
        for (int64_t i = s; i < e; i++) {
            int64_t j = order[i];
            if (I64(F_MAX_START)[j] == top && I64(F_LAST_RANK)[j] > last_rank) last_rank = I64(F_LAST_RANK)[j];
            if (F64(F_BYTES)[j] == bytes) at_max = j;
            if (F64(F_MIN_BYTES)[j] == low) at_min = j;
            if (I64(F_SRC_MIN)[j] == smin) a_smin = j;
            if (I64(F_SRC_MAX)[j] == smax) a_smax = j;
            if (I64(F_DT_MIN)[j] == dmin) a_dmin = j;
            if (I64(F_DT_MAX)[j] == dmax) a_dmax = j;
        }
        if (at_max < 0) at_max = order[0];
        if (at_min < 0) at_min = order[0];
        O64(F_KEY)[k] = key0;
        O64(F_OP)[k] = op;
        O64(F_MIN_START)[k] = mn;
        O64(F_MAX_START)[k] = top;
        O64(F_N)[k] = cnt;
        OF64(F_BYTES)[k] = bytes;
        O64(F_LAST_RANK)[k] = last_rank;
        O64(F_OP_MAX)[k] = op_max;
        OF64(F_MIN_BYTES)[k] = low;
        O64(F_MIN_BYTES_RANK)[k] = I64(F_MIN_BYTES_RANK)[at_min];
        O64(F_MAX_BYTES_RANK)[k] = I64(F_MAX_BYTES_RANK)[at_max];
        OF64(F_GSIZE)[k] = gs;
        O64(F_SRC_MIN)[k] = smin;
        O64(F_SRC_MAX)[k] = smax;
        O64(F_SRC_MIN_RANK)[k] = I64(F_SRC_MIN_RANK)[a_smin];
        O64(F_SRC_MAX_RANK)[k] = I64(F_SRC_MAX_RANK)[a_smax];
        O64(F_DT_MIN)[k] = dmin;
        O64(F_DT_MAX)[k] = dmax;
        O64(F_DT_MIN_RANK)[k] = I64(F_DT_MIN_RANK)[a_dmin];
        O64(F_DT_MAX_RANK)[k] = I64(F_DT_MAX_RANK)[a_dmax];
        k++;
        s = e;
    }
    return k;
}

/* Sums per key where each key's rows are one run and the runs come in
 * ascending key order (a chunk's calls, rank by rank), as
 * collectives._sums_per_key gives them: key[i] = a[i] * width + b[i] + add;
 * the weight (double)(ti[i] - t_ref) where ti is given, else tf[i] (a NaN
 * as 0, known[] then counting the rest); each run's weights added one by
 * one in row order, then 0.0 added (as numpy's bincount, from 0.0, and a
 * running sum give them). Writes up to cap runs (out_key, out_sum, out_n,
 * out_known where given) and returns their number, or -1 where the runs'
 * keys do not ascend or there are more than cap: the caller then sums
 * with numpy. */
int64_t commprof_run_sums(int64_t n, const int64_t *a, const int64_t *b, int64_t width, int64_t add,
                          const int64_t *ti, int64_t t_ref, const double *tf, int64_t cap, int64_t *out_key,
                          double *out_sum, int64_t *out_n, double *out_known)
{
    int64_t runs = 0, i = 0;
    while (i < n) {
        int64_t key = a[i] * width + b[i] + add;
        if (runs == cap || (runs > 0 && key <= out_key[runs - 1]))
            return -1;
        double sum = 0.0, known = 0.0;
        int64_t j = i;
        for (; j < n && a[j] * width + b[j] + add == key; j++) {
            double w;
            if (ti) {
                w = (double)(ti[j] - t_ref);
            } else {
                w = tf[j];
                if (w != w)
                    w = 0.0;
                else
                    known += 1.0;
            }
            sum = j == i ? w : sum + w;
        }
        out_key[runs] = key;
        out_sum[runs] = sum + 0.0;
        out_n[runs] = j - i;
        if (out_known)
            out_known[runs] = known;
        runs++;
        i = j;
    }
    return runs;
}

/* commprof_reduce_instances of one chunk's raw calls (n = 1 each) where
 * they come as runs of equal length whose keys are the same: rows r * k + i
 * (r = 0..n/k-1) are instance i, and a stable sort by key would take them
 * in that order (a merged trace's chunk: a few ranks, each in every
 * instance, seq ascending). Key of row j: gid[j] << seq_bits | seq[j]. The
 * raw fields: an op code (op and op_max), the issue ts (min_start and
 * max_start), the completion te (summed as te - t_ref in float64), bytes
 * (max and min), rank (the rank of every extreme), group size, source and
 * dtype codes. The summed completions add up as numpy's reduceat does
 * (the first value, then the rest summed from -0.0: pairwise summation adds
 * fewer than 8 values one by one), so at most 8 runs. Writes k rows of the
 * fields in collectives._INST_FIELDS order (out[f][0..k)), returns k, or
 * -1 where the rows are not such runs (1 run, more than 8, keys not
 * ascending in the first run or not the same in the others): the caller
 * then sorts. With out NULL, only checks the rows and returns k. */
int64_t commprof_reduce_runs(int64_t n, const int64_t *gid, const int64_t *seq, int seq_bits, const int64_t *op,
                             const int64_t *ts, const int64_t *te, int64_t t_ref, const double *nbytes,
                             const int64_t *rank, const double *gsize, const int64_t *src, const int64_t *dt,
                             void **out)
{
    if (n < 2)
        return -1;
    int64_t k = 1;
    while (k < n && ((gid[k] << seq_bits) | seq[k]) > ((gid[k - 1] << seq_bits) | seq[k - 1]))
        k++;
    int64_t runs = n / k;
    if (runs < 2 || runs > 8 || runs * k != n)
        return -1;
    for (int64_t r = 1; r < runs; r++)
        for (int64_t i = 0; i < k; i++)
            if (gid[r * k + i] != gid[i] || seq[r * k + i] != seq[i])
                return -1;
    if (!out)
        return k;
    for (int64_t i = 0; i < k; i++) {
        int64_t j0 = i;
        int64_t o_min = op[j0], o_max = op[j0], mn = ts[j0], top = ts[j0];
        double bytes = nbytes[j0], low = nbytes[j0], gs = gsize[j0];
        int64_t smin = src[j0], smax = src[j0], dmin = dt[j0], dmax = dt[j0];
        double rest = -0.0;     /* as numpy's pairwise sum starts */
        for (int64_t r = 1; r < runs; r++) {
            int64_t j = r * k + i;
            if (op[j] < o_min) o_min = op[j];
            if (op[j] > o_max) o_max = op[j];
            if (ts[j] < mn) mn = ts[j];
            if (ts[j] > top) top = ts[j];
            bytes = fmax_nan(bytes, nbytes[j]);
            low = fmin_nan(low, nbytes[j]);
            gs = fmax_nan(gs, gsize[j]);
            if (src[j] < smin) smin = src[j];
            if (src[j] > smax) smax = src[j];
            if (dt[j] < dmin) dmin = dt[j];
            if (dt[j] > dmax) dmax = dt[j];
            rest += (double)(te[j] - t_ref);
        }
        int64_t last_rank = INT64_MIN, at_max = -1, at_min = -1, a_smin = -1, a_smax = -1, a_dmin = -1, a_dmax = -1;
        for (int64_t r = 0; r < runs; r++) {
            int64_t j = r * k + i;
            if (ts[j] == top && rank[j] > last_rank) last_rank = rank[j];
            if (nbytes[j] == bytes) at_max = j;
            if (nbytes[j] == low) at_min = j;
            if (src[j] == smin) a_smin = j;
            if (src[j] == smax) a_smax = j;
            if (dt[j] == dmin) a_dmin = j;
            if (dt[j] == dmax) a_dmax = j;
        }
        if (at_max < 0) at_max = 0;     /* sorted row 0: the first run's first row */
        if (at_min < 0) at_min = 0;
        ((int64_t *)out[F_KEY])[i] = (gid[i] << seq_bits) | seq[i];
        ((int64_t *)out[F_OP])[i] = o_min;
        ((int64_t *)out[F_MIN_START])[i] = mn;
        ((int64_t *)out[F_MAX_START])[i] = top;
        ((double *)out[F_SUM_END])[i] = (double)(te[j0] - t_ref) + rest;
        ((int64_t *)out[F_N])[i] = runs;
        ((double *)out[F_BYTES])[i] = bytes;
        ((int64_t *)out[F_LAST_RANK])[i] = last_rank;
        ((int64_t *)out[F_OP_MAX])[i] = o_max;
        ((double *)out[F_MIN_BYTES])[i] = low;
        ((int64_t *)out[F_MIN_BYTES_RANK])[i] = rank[at_min];
        ((int64_t *)out[F_MAX_BYTES_RANK])[i] = rank[at_max];
        ((double *)out[F_GSIZE])[i] = gs;
        ((int64_t *)out[F_SRC_MIN])[i] = smin;
        ((int64_t *)out[F_SRC_MAX])[i] = smax;
        ((int64_t *)out[F_SRC_MIN_RANK])[i] = rank[a_smin];
        ((int64_t *)out[F_SRC_MAX_RANK])[i] = rank[a_smax];
        ((int64_t *)out[F_DT_MIN])[i] = dmin;
        ((int64_t *)out[F_DT_MAX])[i] = dmax;
        ((int64_t *)out[F_DT_MIN_RANK])[i] = rank[a_dmin];
        ((int64_t *)out[F_DT_MAX_RANK])[i] = rank[a_dmax];
    }
    return k;
}

/* The breakdown's per-rank time lines (analyzers/breakdown.py, _rank_keys),
 * first pass: rank[i] - lo is a slot in [0, n_slots); slot_idx[] (n_slots,
 * filled with -1 by the caller) gets each present slot's index among the
 * present ones in rank order, t0[] (n_slots, filled with INT64_MAX) the
 * least of its events' starts and ends, ridx[i] the index of event i's
 * rank. Returns the largest time of an event on its rank's line (t - t0,
 * wrapping as numpy's int64 arithmetic does). The caller gives lo and
 * n_slots from the ranks' least and greatest values. */
int64_t commprof_rank_lines(int64_t n, const int64_t *rank, const int64_t *ts, const int64_t *te, int64_t lo,
                            int64_t n_slots, int64_t *slot_idx, int64_t *t0, int64_t *ridx)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t s = rank[i] - lo;
        int64_t m = ts[i] < te[i] ? ts[i] : te[i];
        if (m < t0[s])
            t0[s] = m;
        slot_idx[s] = 0;
    }
    int64_t k = 0;
    for (int64_t s = 0; s < n_slots; s++)
        if (slot_idx[s] == 0)
            slot_idx[s] = k++;
    int64_t span = INT64_MIN;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = rank[i] - lo;
        ridx[i] = slot_idx[s];
        int64_t a = (int64_t)((uint64_t)ts[i] - (uint64_t)t0[s]);
        int64_t b = (int64_t)((uint64_t)te[i] - (uint64_t)t0[s]);
        if (a > span)
            span = a;
        if (b > span)
            span = b;
    }
    return span;
}

/* Second pass: the keys, (ridx << shift) | (t - t0 of the rank). */
void commprof_rank_keys(int64_t n, const int64_t *rank, const int64_t *ts, const int64_t *te, int64_t lo,
                        const int64_t *t0, const int64_t *ridx, int shift, int64_t *kstart, int64_t *kend)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t base = (uint64_t)t0[rank[i] - lo], hi = (uint64_t)ridx[i] << shift;
        kstart[i] = (int64_t)(hi | ((uint64_t)ts[i] - base));
        kend[i] = (int64_t)(hi | ((uint64_t)te[i] - base));
    }
}

/* The sweep's two row masks in one pass (analyzers/run.py, _event_masks):
 * keep_comm[i] when event i is a collective (cat == comm_code) of a measured
 * step of its rank (first[s] <= step <= last[s], s = rank - lo; first >
 * last where the rank measured nothing), keep_fine[i] when its category is
 * one the fine grain reads (fine_cat[cat], cat in [0, n_cat)) and its
 * (rank, step) is sampled (sampled[s * width + step - s0], steps outside
 * [s0, s0 + width) are not). Ranks lie in [lo, lo + n_slots). Returns the
 * number of collectives, measured or not. */
int64_t commprof_event_masks(int64_t n, const int64_t *rank, const int64_t *step, const int8_t *cat, int64_t lo,
                             const int64_t *first, const int64_t *last, int comm_code, const uint8_t *fine_cat,
                             int n_cat, int64_t s0, int64_t width, const uint8_t *sampled, uint8_t *keep_comm,
                             uint8_t *keep_fine)
{
    int64_t comm = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = rank[i] - lo, st = step[i];
        int c = cat[i];
        int is_comm = c == comm_code;
        comm += is_comm;
        keep_comm[i] = (uint8_t)(is_comm && st >= first[s] && st <= last[s]);
        int64_t k = st - s0;
        keep_fine[i] = (uint8_t)(c >= 0 && c < n_cat && fine_cat[c] && k >= 0 && k < width && sampled[s * width + k]);
    }
    return comm;
}

/* A stable argsort of keys that lie close to their sorted places (a chunk's
 * events on the ranks' time lines: each a few rows from where its start or
 * end sorts), by insertion: the order numpy's stable argsort gives. Returns
 * the number of places moved, or -1 once that passes max_moves (the caller
 * then sorts with numpy). */
/* Row i of an insertion sort: order[0..i) holds rows 0..i-1 in key order
 * (stable); row i goes after every row whose key is not greater. Returns
 * the places moved, or -1 past room. */
static inline int64_t insert_near(const int64_t *key, int64_t *order, int64_t i, int64_t room)
{
    int64_t k = key[i], j = i;
    while (j > 0 && key[order[j - 1]] > k) {
        order[j] = order[j - 1];
        j--;
        if (i - j > room)
            return -1;
    }
    order[j] = i;
    return i - j;
}

int64_t commprof_argsort_near(int64_t n, const int64_t *key, int64_t *order, int64_t max_moves)
{
    int64_t moves = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t m = insert_near(key, order, i, max_moves - moves);
        if (m < 0)
            return -1;
        moves += m;
    }
    return moves;
}

/* The breakdown's sweep of a chunk whose events come in runs of one rank
 * (analyzers/breakdown.py, step_arrays), every run on its own: the labels
 * from the categories (label_of_cat, a category outside [0, n_lut) taking
 * entry n_lut; a collective, cat == comm_code, that blocks takes
 * blocking_label), each run's starts and ends sorted apart by insertion
 * (stable, as commprof_argsort_near) into the scratch order_s / order_e,
 * then commprof_pattern_weighted's merge and figures (for up to 6 sets,
 * merge_sweep_runs: the same sums). The same windows and
 * figures as _rank_keys, then pattern_table over the whole chunk: a rank's
 * keys are its own times shifted by one constant, its run's keys all lie
 * below the next rank's, and every interval of a run has ended before the
 * next run's first boundary (intervals that do not end after they start
 * are passed over), so the chunk's sweep is its runs' sweeps one after
 * the other. Runs [run_lo[r], run_hi[r]) in the order given (ranks
 * ascending). Writes each window's figures (out[w * m ..], zeroed by the
 * caller) and its row (win_rows[w]); returns the number of windows, or -1
 * when a run's times are too far from sorted (past max_moves moves per
 * key), a window would pass max_win, n_sets or m is out of range, a
 * weight is not 0 or 1, or a run's
 * times span max_span ns or more (they would not fit _rank_keys' keys,
 * which then says why): the caller then takes the general path. */
int64_t commprof_step_sweep(int64_t n_runs, const int64_t *run_lo, const int64_t *run_hi, const int8_t *cat,
                            const uint8_t *blocking, const int64_t *ts, const int64_t *te, const int8_t *label_of_cat,
                            int n_lut, int comm_code, int blocking_label, int n_sets, const double *weights, int m,
                            int64_t *order_s, int64_t *order_e, int8_t *lab, double *out, int64_t *win_rows,
                            int64_t max_win, int64_t max_moves, int64_t max_span)
{
    uint32_t cols[1 << 12];
    if (weight_columns(n_sets, weights, m, cols))
        return -1;
    int64_t row = -1;
    for (int64_t r = 0; r < n_runs; r++) {
        int64_t lo = run_lo[r], n = run_hi[r] - lo;
        if (n <= 0)
            continue;
        const int64_t *s = ts + lo, *e = te + lo;
        int8_t *lb = lab + lo;
        int64_t moves_s = 0, moves_e = 0, budget = max_moves * n;
        int64_t first = s[0] < e[0] ? s[0] : e[0], last = s[0] < e[0] ? e[0] : s[0];
        for (int64_t i = 0; i < n; i++) {     /* the run's span found in the same pass (checked before the merge) */
            int64_t lo_t = s[i] < e[i] ? s[i] : e[i], hi_t = s[i] < e[i] ? e[i] : s[i];
            if (lo_t < first)
                first = lo_t;
            if (hi_t > last)
                last = hi_t;
            int c = cat[lo + i];
            int f = c >= 0 && c < n_lut ? label_of_cat[c] : label_of_cat[n_lut];
            if (c == comm_code && blocking[lo + i])
                f = blocking_label;
            lb[i] = (int8_t)(f >= 0 && f <= n_sets && e[i] > s[i] ? f : -1);
            int64_t ms = insert_near(s, order_s, i, budget - moves_s), me = insert_near(e, order_e, i, budget - moves_e);
            if (ms < 0 || me < 0)
                return -1;
            moves_s += ms;
            moves_e += me;
        }
        if ((uint64_t)last - (uint64_t)first >= (uint64_t)max_span)
            return -1;
        row = n_sets <= 6 ? merge_sweep_runs(s, e, lb, n, order_s, order_e, n_sets, cols, m, out, row, max_win,
                                             win_rows, lo)
                          : merge_sweep(s, e, lb, n, order_s, order_e, n_sets, cols, m, out, row, max_win, win_rows,
                                        lo, 0);
        if (row < -1)
            return -1;
    }
    return row + 1;
}

/* Order statistics for the straggler tests (analyzers/stragglers.py):
 * values, not positions, so any selection gives numpy's partition's. A
 * NaN or a negative zero (whose place beside 0.0 a selection does not
 * fix) makes the caller take the numpy path: these return -1. */

/* a[lo..hi] (inclusive) rearranged so that a[k] is its (k - lo)-th
 * smallest, those before it no larger, those after no smaller
 * (quickselect, the median of three as pivot, each round two passes that
 * move the values below the pivot, then those equal to it, to the front
 * without a branch on the values: their order is random, a branch on
 * them mispredicted about every other value; past 64 rounds, the rest by
 * insertion). */
static void select_kth(double *a, int64_t lo, int64_t hi, int64_t k)
{
    int rounds = 0;
    while (hi > lo) {
        if (++rounds > 64 || hi - lo < 16) {
            for (int64_t i = lo + 1; i <= hi; i++) {
                double v = a[i];
                int64_t j = i - 1;
                while (j >= lo && a[j] > v) {
                    a[j + 1] = a[j];
                    j--;
                }
                a[j + 1] = v;
            }
            return;
        }
        int64_t mid = lo + (hi - lo) / 2;
        double x = a[lo], y = a[mid], z = a[hi];
        double p = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int64_t below = lo;
        for (int64_t i = lo; i <= hi; i++) {
            double v = a[i];
            a[i] = a[below];
            a[below] = v;
            below += v < p;
        }
        int64_t equal = below;
        for (int64_t i = below; i <= hi; i++) {
            double v = a[i];
            a[i] = a[equal];
            a[equal] = v;
            equal += v == p;
        }
        if (k < below)
            hi = below - 1;
        else if (k >= equal)
            lo = equal;
        else
            return;         /* a[k] equals the pivot, in place */
    }
}

/* a[0..n) rearranged so that a[kth[i]] is its kth[i]-th smallest, for
 * kth ascending: each selected within what lies above the one before (the
 * least of them by one scan where it is the next one up). */
static void select_ascending(double *a, int64_t n, const int64_t *kth, int64_t n_kth)
{
    int64_t lo = 0;
    for (int64_t i = 0; i < n_kth; i++) {
        int64_t k = kth[i];
        if (k == lo) {
            int64_t at = lo;
            for (int64_t j = lo + 1; j < n; j++)
                if (a[j] < a[at])
                    at = j;
            double t = a[lo];
            a[lo] = a[at];
            a[at] = t;
        } else {
            select_kth(a, lo, n - 1, k);
        }
        lo = k + 1;
    }
}

static int plain(double v)
{
    return v == v && !(v == 0.0 && 1.0 / v < 0.0);
}

/* Per cell of the rows x units matrix m (row-major): the median of the
 * other units in its row, as stragglers.others_median computes it (the
 * row's order statistics k and k + 1; the unit's own value above the k-th
 * takes the k-th, else the (k + 1)-th; with an even number of others, half
 * the sum of the two middle ones). scratch: units doubles. */
int64_t commprof_others_median(int64_t rows, int64_t units, const double *m, double *scratch, double *out)
{
    if (units < 2)
        return -1;
    int64_t others = units - 1, k0 = others % 2 ? others / 2 : others / 2 - 1;
    int two = others % 2 == 0;
    const int64_t ks[3] = {k0, k0 + 1, k0 + 2};
    for (int64_t r = 0; r < rows; r++) {
        const double *row = m + r * units;
        for (int64_t u = 0; u < units; u++) {
            if (!plain(row[u]))
                return -1;
            scratch[u] = row[u];
        }
        select_ascending(scratch, units, ks, two ? 3 : 2);
        double s0 = scratch[k0], s1 = scratch[k0 + 1], s2 = two ? scratch[k0 + 2] : 0.0;
        double *o = out + r * units;
        for (int64_t u = 0; u < units; u++) {
            double a = row[u] > s0 ? s0 : s1;
            o[u] = two ? 0.5 * (a + (row[u] > s1 ? s1 : s2)) : a;
        }
    }
    return 0;
}

/* The sample a narrow band's pivots are read from, and the shortest
 * column selected by them (shorter ones: over the whole column). */
#define BAND_SAMPLE 1024
#define BAND_MIN_ROWS (4 * BAND_SAMPLE)

/* The order statistics kth[0] < ... < kth[n_kth - 1] (at most 8) of
 * a[0..n) into vals, where they lie in a band narrow against n (the
 * straggler tests read a median and its interval): two pivots are read
 * off an evenly spaced sample of BAND_SAMPLE values, 64 sample places
 * (four standard deviations of a sample quantile) beyond the band's
 * ends; the values
 * between them are gathered to the front of a and the band selected
 * among them (Floyd and Rivest's idea; a's other values are lost). The
 * values are exact whatever the pivots: where the band turns out not to
 * hold them, a is left as it was and -1 returned (the caller selects over
 * the whole column). */
static int select_band(double *a, int64_t n, const int64_t *kth, int64_t n_kth, double *vals)
{
    int64_t k0 = kth[0], k1 = kth[n_kth - 1];
    if (n_kth > 8 || n < BAND_MIN_ROWS || k1 - k0 > n / 16)
        return -1;
    double sample[BAND_SAMPLE];
    for (int64_t i = 0; i < BAND_SAMPLE; i++)
        sample[i] = a[i * n / BAND_SAMPLE];
    int64_t s0 = k0 * BAND_SAMPLE / n - 64, s1 = (k1 * BAND_SAMPLE + n - 1) / n + 64;
    if (s0 < 0 || s1 >= BAND_SAMPLE)
        return -1;
    select_kth(sample, 0, BAND_SAMPLE - 1, s0);
    select_kth(sample, s0 + 1, BAND_SAMPLE - 1, s1);
    double lo = sample[s0], hi = sample[s1];
    int64_t below = 0, above = 0;
    for (int64_t i = 0; i < n; i++) {      /* no branch on the values: they come in no order */
        below += a[i] < lo;
        above += a[i] > hi;
    }
    if (below > k0 || n - above <= k1)
        return -1;
    int64_t w = 0;
    for (int64_t i = 0; i < n; i++) {      /* the band to the front (w <= i: nothing unread is lost) */
        double v = a[i];
        a[w] = v;
        w += (v >= lo) & (v <= hi);
    }
    int64_t local[8];
    for (int64_t j = 0; j < n_kth; j++)
        local[j] = kth[j] - below;
    select_ascending(a, w, local, n_kth);
    for (int64_t j = 0; j < n_kth; j++)
        vals[j] = a[local[j]];
    return 0;
}

/* Per column of the rows x units matrix d (row-major): its order
 * statistics kth[0] < kth[1] < ... (n_kth of them, each below rows) into
 * out[i * units + u]; a band narrow against rows by select_band.
 * scratch: 8 x rows doubles (columns gathered eight at a time: one cache
 * line of each row). */
int64_t commprof_column_kth(int64_t rows, int64_t units, const double *d, int64_t n_kth, const int64_t *kth,
                            double *scratch, double *out)
{
    for (int64_t i = 0; i < n_kth; i++)
        if (kth[i] < 0 || kth[i] >= rows || (i && kth[i] <= kth[i - 1]))
            return -1;
    for (int64_t u0 = 0; u0 < units; u0 += 8) {
        int64_t w = units - u0 < 8 ? units - u0 : 8;
        for (int64_t r = 0; r < rows; r++) {
            const double *row = d + r * units + u0;
            for (int64_t b = 0; b < w; b++) {
                if (!plain(row[b]))
                    return -1;
                scratch[b * rows + r] = row[b];
            }
        }
        for (int64_t b = 0; b < w; b++) {
            double *col = scratch + b * rows, vals[8];
            if (select_band(col, rows, kth, n_kth, vals) == 0) {
                for (int64_t i = 0; i < n_kth; i++)
                    out[i * units + u0 + b] = vals[i];
                continue;
            }
            select_ascending(col, rows, kth, n_kth);
            for (int64_t i = 0; i < n_kth; i++)
                out[i * units + u0 + b] = col[kth[i]];
        }
    }
    return 0;
}
