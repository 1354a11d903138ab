/* quants_iq.c - quantizers for IQ2_XXS and IQ3_XXS: a codebook search under optional importance.
 *
 * Both types store, per sub-block of 32 weights, four groups of 8 and one word: 4 x 7 sign bits
 * (the 8th sign of a group is implied: the count of minus signs is even) and a 4-bit scale s.
 * A weight decodes to d * (2s + 1) * step * sign * level, level taken from a codebook entry
 * (iq_grids.h): one entry of 8 levels per group for IQ2_XXS, two entries of 4 for IQ3_XXS.
 *
 * The search minimises the weighted squared error sum w (x - x')^2, w the importance of the
 * weight's input column (the mean square of that input over calibration text) or 1 without one:
 *  1. each sub-block alone: for a ladder of trial scales, every group takes the codebook entry and
 *     signs nearest x / scale, then the scale that fits that choice by least squares; the best
 *     (choice, scale) pair is kept with its two sums A = sum w q^2 and B = sum w x q;
 *  2. the block: the fp16 d and the sub-block scales s that come closest to the fitted scales,
 *     judged by each sub-block's quadratic A sigma^2 - 2 B sigma;
 *  3. each sub-block again at its final scale: entries and signs chosen anew, then s re-fitted;
 *  4. d scaled so that the block's reconstruction has unit gain along x (see unit_gain).
 *
 * Nearest entry: each element is rounded to the nearest codebook level, which names a point of
 * the full lattice of levels; only the entries nearest that point (a table built once) are
 * scored, exactly, under the weights. The sign rule: an element takes the sign of x; when a
 * group has an odd count of negatives, the one flip that costs least (4 w |x| level / scale^2
 * in units of scale^2) is chosen jointly with the entries.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "iq_grids.h"
#include "status.h"
#include "types.h"

#define IQ_CANDIDATES 16          /* entries scored per lattice point */
#define IQ_SUB 32                 /* weights per sub-block (one scale, four groups of 8) */
#define IQ_TRIALS 12              /* trial scales per sub-block in step 1 */

typedef struct iq_codebook {
    const uint8_t * grid;         /* n_entries x width levels */
    int             width;        /* levels per entry: 8 or 4 */
    int             n_entries;
    float           step;         /* x = d * (2s + 1) * step * level */
    int             n_levels;
    float           levels[8];    /* the distinct levels, ascending */
    int             lattice;      /* n_levels ^ width */
    uint8_t *       cand;         /* lattice x IQ_CANDIDATES entry indices, nearest first */
} iq_codebook;

static uint8_t iq2xxs_cand[6561 * IQ_CANDIDATES];   /* 3 levels ^ 8 */
static uint8_t iq3xxs_cand[4096 * IQ_CANDIDATES];   /* 8 levels ^ 4 */

static iq_codebook iq2xxs_book = { &rm_iq2xxs_grid[0][0], 8, 256, 0.125f, 0, {0}, 0, iq2xxs_cand };
static iq_codebook iq3xxs_book = { &rm_iq3xxs_grid[0][0], 4, 256, 0.25f, 0, {0}, 0, iq3xxs_cand };

/* The distinct levels of the grid, and for every lattice point its nearest entries. */
static void book_init(iq_codebook * cb, int lattice_cap) {
    int n = 0;
    for (int i = 0; i < cb->n_entries * cb->width; ++i) {
        const float v = cb->grid[i];
        int k = 0;
        while (k < n && cb->levels[k] < v) ++k;
        if (k < n && cb->levels[k] == v) continue;
        RM_ASSERT(n < 8);
        memmove(cb->levels + k + 1, cb->levels + k, (size_t)(n - k) * sizeof(float));
        cb->levels[k] = v;
        ++n;
    }
    cb->n_levels = n;
    int lattice = 1;
    for (int j = 0; j < cb->width; ++j) lattice *= n;
    RM_ASSERT(lattice == lattice_cap);
    cb->lattice = lattice;
    for (int p = 0; p < lattice; ++p) {
        float point[8];
        for (int j = 0, r = p; j < cb->width; ++j, r /= n) point[j] = cb->levels[r % n];
        float best_d[IQ_CANDIDATES];
        int best_i[IQ_CANDIDATES], have = 0;
        for (int e = 0; e < cb->n_entries; ++e) {   /* insertion into the sorted short list */
            float dist = 0;
            for (int j = 0; j < cb->width; ++j) {
                const float t = point[j] - cb->grid[e * cb->width + j];
                dist += t * t;
            }
            if (have == IQ_CANDIDATES && dist >= best_d[have - 1]) continue;
            int k = have < IQ_CANDIDATES ? have++ : have - 1;
            while (k > 0 && best_d[k - 1] > dist) {
                best_d[k] = best_d[k - 1];
                best_i[k] = best_i[k - 1];
                --k;
            }
            best_d[k] = dist;
            best_i[k] = e;
        }
        for (int k = 0; k < IQ_CANDIDATES; ++k) cb->cand[p * IQ_CANDIDATES + k] = (uint8_t)best_i[k];
    }
}

static pthread_once_t books_once = PTHREAD_ONCE_INIT;

static void books_init(void) {
    book_init(&iq2xxs_book, 6561);
    book_init(&iq3xxs_book, 4096);
}

/* The lattice point of one entry's worth of targets t (x / scale, magnitudes). */
static int lattice_point(const iq_codebook * cb, const float * t) {
    int p = 0;
    for (int j = cb->width - 1; j >= 0; --j) {
        int k = 0;
        while (k + 1 < cb->n_levels && t[j] > 0.5f * (cb->levels[k] + cb->levels[k + 1])) ++k;
        p = p * cb->n_levels + k;
    }
    return p;
}

/* One group of 8 at scale sigma: codebook entries in idx (8 / width of them), the 8-bit sign mask
 * (even parity) in *mask, the signed levels in q. */
static void assign_group(const iq_codebook * cb, const float * x, const float * w, float sigma,
                         uint8_t * idx, uint8_t * mask, float q[8]) {
    const float inv = sigma > 0 ? 1.0f / sigma : 0.0f;
    const int halves = 8 / cb->width;
    uint8_t m = 0;
    float t[8];
    for (int j = 0; j < 8; ++j) {
        t[j] = fabsf(x[j]) * inv;
        if (x[j] < 0) m |= (uint8_t)(1u << j);
    }
    int odd = __builtin_popcount(m) & 1;
    /* per half: the best entry kept as is, and the best entry with one element flipped */
    float keep_err[2], flip_err[2];
    int keep_e[2], flip_e[2], flip_j[2];
    for (int h = 0; h < halves; ++h) {
        const float * th = t + h * cb->width;
        const float * wh = w + h * cb->width;
        const uint8_t * cand = cb->cand + lattice_point(cb, th) * IQ_CANDIDATES;
        keep_err[h] = flip_err[h] = INFINITY;
        keep_e[h] = flip_e[h] = cand[0];
        flip_j[h] = 0;
        for (int c = 0; c < IQ_CANDIDATES; ++c) {
            const uint8_t * g = cb->grid + cand[c] * cb->width;
            float err = 0, cheapest = INFINITY;
            int cj = 0;
            for (int j = 0; j < cb->width; ++j) {
                const float d = th[j] - g[j], f = 4.0f * wh[j] * th[j] * g[j];
                err += wh[j] * d * d;
                if (f < cheapest) { cheapest = f; cj = j; }
            }
            if (err < keep_err[h]) { keep_err[h] = err; keep_e[h] = cand[c]; }
            if (err + cheapest < flip_err[h]) { flip_err[h] = err + cheapest; flip_e[h] = cand[c]; flip_j[h] = cj; }
        }
    }
    int flip_half = -1;
    if (odd) {
        flip_half = 0;
        if (halves == 2 && keep_err[0] + flip_err[1] < flip_err[0] + keep_err[1]) flip_half = 1;
    }
    for (int h = 0; h < halves; ++h) {
        idx[h] = (uint8_t)(h == flip_half ? flip_e[h] : keep_e[h]);
        if (h == flip_half) m ^= (uint8_t)(1u << (h * cb->width + flip_j[h]));
    }
    for (int h = 0; h < halves; ++h)
        for (int j = 0; j < cb->width; ++j) {
            const int k = h * cb->width + j;
            const float g = cb->grid[idx[h] * cb->width + j];
            q[k] = (m >> k) & 1 ? -g : g;
        }
    *mask = m;
}

typedef struct iq_sub {
    uint8_t idx[8];               /* entries: 4 groups x (8 / width) */
    uint8_t mask[4];              /* sign masks of the 4 groups */
    float   a, b;                 /* sum w q^2, sum w x q for this choice */
} iq_sub;

static void assign_sub(const iq_codebook * cb, const float * x, const float * w, float sigma, iq_sub * s) {
    const int halves = 8 / cb->width;
    float q[8];
    s->a = s->b = 0;
    for (int g = 0; g < 4; ++g) {
        assign_group(cb, x + 8 * g, w + 8 * g, sigma, s->idx + halves * g, s->mask + g, q);
        for (int j = 0; j < 8; ++j) {
            s->a += w[8 * g + j] * q[j] * q[j];
            s->b += w[8 * g + j] * x[8 * g + j] * q[j];
        }
    }
}

/* The error of a choice at scale sigma, less the constant sum w x^2. */
static float sub_cost(const iq_sub * s, float sigma) { return s->a * sigma * sigma - 2.0f * s->b * sigma; }

/* Step 1: the best choice for a sub-block alone and its least-squares scale. */
static float fit_sub(const iq_codebook * cb, const float * x, const float * w, iq_sub * best) {
    float amax = 0;
    for (int j = 0; j < IQ_SUB; ++j) amax = fmaxf(amax, fabsf(x[j]));
    assign_sub(cb, x, w, 0, best);
    if (amax == 0) return 0;
    const float top = cb->levels[cb->n_levels - 1];
    float best_sigma = 0, best_cost = INFINITY;
    for (int k = 0; k < IQ_TRIALS; ++k) {
        /* amax lands from 0.7 to 1.8 times the top level: the larger the more the top clips */
        const float sigma = amax / (top * (0.7f + 0.1f * (float)k));
        iq_sub s;
        assign_sub(cb, x, w, sigma, &s);
        if (s.a <= 0 || s.b <= 0) continue;
        const float fitted = s.b / s.a, cost = sub_cost(&s, fitted);
        if (cost < best_cost) {
            best_cost = cost;
            best_sigma = fitted;
            *best = s;
        }
    }
    return best_sigma;
}

/* The scale s in 0..15 whose sigma = d * (2s + 1) * step costs least for choice sub. */
static int best_scale(const iq_sub * sub, float d, float step) {
    int best = 0;
    float best_cost = INFINITY;
    for (int s = 0; s < 16; ++s) {
        const float c = sub_cost(sub, d * (float)(2 * s + 1) * step);
        if (c < best_cost) { best_cost = c; best = s; }
    }
    return best;
}

/* Step 2: d for the block, from the fitted scales; rounded to fp16. Returns the fp16 bits. */
static rm_fp16 fit_block_scale(const iq_codebook * cb, const iq_sub sub[RM_QK_K / IQ_SUB],
                               const float sigma[RM_QK_K / IQ_SUB]) {
    float smax = 0;
    for (int j = 0; j < RM_QK_K / IQ_SUB; ++j) smax = fmaxf(smax, sigma[j]);
    if (smax == 0) return rm_fp32_to_fp16(0.0f);
    rm_fp16 best = rm_fp32_to_fp16(smax / (31.0f * cb->step));
    float best_cost = INFINITY;
    for (int top = 15; top >= 9; --top) {   /* the largest sub-block scale at s = top */
        for (int pass = 0; pass < 2; ++pass) {
            float d = smax / ((float)(2 * top + 1) * cb->step);
            if (pass == 1) {   /* least squares for d, the scales s as pass 0 chose them */
                float num = 0, den = 0;
                for (int j = 0; j < RM_QK_K / IQ_SUB; ++j) {
                    const float m = (float)(2 * best_scale(&sub[j], d, cb->step) + 1) * cb->step;
                    num += sub[j].b * m;
                    den += sub[j].a * m * m;
                }
                if (den <= 0 || num <= 0) continue;
                d = num / den;
            }
            const rm_fp16 h = rm_fp32_to_fp16(d);
            const float dh = rm_fp16_to_fp32(h);
            if (!(dh > 0) || isinf(dh)) continue;
            float cost = 0;
            for (int j = 0; j < RM_QK_K / IQ_SUB; ++j)
                cost += sub_cost(&sub[j], dh * (float)(2 * best_scale(&sub[j], dh, cb->step) + 1) * cb->step);
            if (cost < best_cost) { best_cost = cost; best = h; }
        }
    }
    return best;
}

/* The importance of a block's weights: imp scaled to mean 1, with a floor so that a column no
 * calibration token touched still counts a little; 1 everywhere without imp. */
static void block_weights(const float * imp, float w[RM_QK_K]) {
    if (imp == NULL) {
        for (int e = 0; e < RM_QK_K; ++e) w[e] = 1.0f;
        return;
    }
    double sum = 0;
    for (int e = 0; e < RM_QK_K; ++e) sum += imp[e];
    const float mean = (float)(sum / RM_QK_K);
    if (!(mean > 0)) {
        for (int e = 0; e < RM_QK_K; ++e) w[e] = 1.0f;
        return;
    }
    for (int e = 0; e < RM_QK_K; ++e) w[e] = imp[e] / mean + 1e-3f;
}

/* Step 4: d scaled so that the block keeps its weighted gain along x: sum w x x' = sum w x^2.
 * A least-squares fit shrinks x' toward zero by the factor 1 - e^2 (e the relative error); at
 * 2 bits (e^2 about 0.13) that scales every matrix's output down by as much, a bias that builds
 * up through the layers. On the bundled model, scaling it away took the mean KL divergence of an
 * IQ2_XXS base from 0.029 to 0.009 (the same error as noise costs far less than as a bias). */
static float unit_gain(const iq_codebook * cb, const float * x, const float * w,
                       const iq_sub sub[RM_QK_K / IQ_SUB], const int scale[RM_QK_K / IQ_SUB], float d) {
    double xx = 0, xq = 0;
    for (int j = 0; j < RM_QK_K / IQ_SUB; ++j) {
        for (int k = 0; k < IQ_SUB; ++k) xx += w[IQ_SUB * j + k] * x[IQ_SUB * j + k] * x[IQ_SUB * j + k];
        xq += (double)(2 * scale[j] + 1) * cb->step * sub[j].b;   /* sum w x x' / d */
    }
    return xq > 0 ? (float)(xx / xq) : d;
}

/* One block of 256: fills d, per sub-block the choice and its scale s. */
static float quantize_block(const iq_codebook * cb, const float * x, const float * imp,
                            iq_sub sub[RM_QK_K / IQ_SUB], int scale[RM_QK_K / IQ_SUB]) {
    float w[RM_QK_K], sigma[RM_QK_K / IQ_SUB];
    block_weights(imp, w);
    for (int j = 0; j < RM_QK_K / IQ_SUB; ++j) sigma[j] = fit_sub(cb, x + IQ_SUB * j, w + IQ_SUB * j, &sub[j]);
    const float d = rm_fp16_to_fp32(fit_block_scale(cb, sub, sigma));
    for (int j = 0; j < RM_QK_K / IQ_SUB; ++j) {
        const float * xj = x + IQ_SUB * j, * wj = w + IQ_SUB * j;
        scale[j] = best_scale(&sub[j], d, cb->step);
        if (d == 0) continue;
        for (int round = 0; round < 2; ++round) {   /* entries at the final scale, then s again */
            iq_sub s;
            const float sg = d * (float)(2 * scale[j] + 1) * cb->step;
            assign_sub(cb, xj, wj, sg, &s);
            const int ns = best_scale(&s, d, cb->step);
            const float old_cost = sub_cost(&sub[j], sg);
            if (sub_cost(&s, d * (float)(2 * ns + 1) * cb->step) >= old_cost) break;
            sub[j] = s;
            if (ns == scale[j]) break;
            scale[j] = ns;
        }
    }
    return unit_gain(cb, x, w, sub, scale, d);
}

/* The 32-bit word of a sub-block: 4 x 7 sign bits, then the scale in the top 4. */
static uint32_t sign_word(const iq_sub * s, int scale) {
    uint32_t v = (uint32_t)scale << 28;
    for (int g = 0; g < 4; ++g) {
        RM_ASSERT(rm_iq_ksigns[s->mask[g] & 127] == s->mask[g]);   /* even parity by construction */
        v |= (uint32_t)(s->mask[g] & 127) << (7 * g);
    }
    return v;
}

void rm_iq2_xxs_quantize(const float * x, void * dst, int64_t n, const float * imp) {
    pthread_once(&books_once, books_init);
    rm_block_iq2_xxs * y = dst;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, x += RM_QK_K, imp = imp ? imp + RM_QK_K : NULL) {
        iq_sub sub[RM_QK_K / IQ_SUB];
        int scale[RM_QK_K / IQ_SUB];
        y[i].d = rm_fp32_to_fp16(quantize_block(&iq2xxs_book, x, imp, sub, scale));
        uint8_t * q = (uint8_t *)y[i].qs;
        for (int j = 0; j < RM_QK_K / IQ_SUB; ++j, q += 8) {
            const uint32_t word = sign_word(&sub[j], scale[j]);
            memcpy(q, sub[j].idx, 4);
            memcpy(q + 4, &word, 4);
        }
    }
}

void rm_iq3_xxs_quantize(const float * x, void * dst, int64_t n, const float * imp) {
    pthread_once(&books_once, books_init);
    rm_block_iq3_xxs * y = dst;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, x += RM_QK_K, imp = imp ? imp + RM_QK_K : NULL) {
        iq_sub sub[RM_QK_K / IQ_SUB];
        int scale[RM_QK_K / IQ_SUB];
        y[i].d = rm_fp32_to_fp16(quantize_block(&iq3xxs_book, x, imp, sub, scale));
        for (int j = 0; j < RM_QK_K / IQ_SUB; ++j) {
            const uint32_t word = sign_word(&sub[j], scale[j]);
            memcpy(y[i].qs + 8 * j, sub[j].idx, 8);
            memcpy(y[i].qs + RM_QK_K / 4 + 4 * j, &word, 4);
        }
    }
}

void rm_iq2_xxs_from_float(const float * x, void * dst, int64_t n) { rm_iq2_xxs_quantize(x, dst, n, NULL); }
void rm_iq3_xxs_from_float(const float * x, void * dst, int64_t n) { rm_iq3_xxs_quantize(x, dst, n, NULL); }
