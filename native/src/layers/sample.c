/* sample.c - token sampling: repetition penalty, temperature, top-k, top-p, min-p, seeded draw.
 *
 * The order is the one transformers uses (penalty, temperature, then the filters), so a given
 * seed gives the same text on every run and every machine. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rapidmoe.h"
#include "rng.h"
#include "status.h"

struct rm_sampler {
    rm_sampler_params p;
    uint64_t          state;      /* rng.h */
    float *           work;       /* n_vocab logits, copied */
    int32_t *         idx;        /* n_vocab candidate ids */
    int32_t           cap;
};

rm_status rm_sampler_new(const rm_sampler_params * p, rm_sampler ** out) {
    rm_clear_error();
    if (!p || !out) {
        return rm_fail(RM_E_INVALID_ARG, "rm_sampler_new: NULL argument");
    }
    *out = NULL;
    if (p->struct_size != sizeof(rm_sampler_params)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_sampler_new: params.struct_size %u != %zu (mismatched header)",
                       p->struct_size, sizeof(rm_sampler_params));
    }
    if (!isfinite(p->temperature) || p->temperature < 0.0f) {
        return rm_fail(RM_E_INVALID_ARG, "rm_sampler_new: temperature %g must be >= 0", p->temperature);
    }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_sampler_new: top_p %g must be in (0, 1]", p->top_p);
    }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_sampler_new: min_p %g must be in [0, 1]", p->min_p);
    }
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_sampler_new: repeat_penalty %g must be > 0", p->repeat_penalty);
    }
    if (p->top_k < 0 || p->repeat_last_n < 0) {
        return rm_fail(RM_E_INVALID_ARG, "rm_sampler_new: top_k %d and repeat_last_n %d must be >= 0",
                       p->top_k, p->repeat_last_n);
    }
    rm_sampler * smp = calloc(1, sizeof(*smp));
    if (!smp) {
        return rm_fail(RM_E_OOM, "rm_sampler_new: out of memory");
    }
    smp->p = *p;
    smp->state = rm_rng_seed(p->seed);
    *out = smp;
    return RM_OK;
}

void rm_sampler_free(rm_sampler * smp) {
    if (!smp) {
        return;
    }
    free(smp->work);
    free(smp->idx);
    free(smp);
}

static int by_logit_desc(const void * a, const void * b, void * ctx) {
    const float * w = ctx;
    const float x = w[*(const int32_t *) a], y = w[*(const int32_t *) b];
    return x < y ? 1 : x > y ? -1 : (*(const int32_t *) a - *(const int32_t *) b);
}

/* a ranks before b: higher logit first, then lower id (the order by_logit_desc sorts into) */
static inline int ranks_before(const float * w, int32_t a, int32_t b) {
    return w[a] > w[b] || (w[a] == w[b] && a < b);
}

static void sift_down(int32_t * heap, int32_t n, int32_t i, const float * w) {
    for (;;) {
        int32_t worst = i;
        const int32_t l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(w, heap[worst], heap[l])) worst = l;
        if (r < n && ranks_before(w, heap[worst], heap[r])) worst = r;
        if (worst == i) return;
        const int32_t t = heap[i];
        heap[i] = heap[worst];
        heap[worst] = t;
        i = worst;
    }
}

/* The k best ids into idx[0, k), in rank order: a heap of the k best so far (its root the worst of
 * them), so a large vocabulary costs O(n log k) instead of a full sort. */
static void top_k_ids(int32_t * idx, const float * w, int32_t n, int32_t k) {
    for (int32_t i = 0; i < k; i++) idx[i] = i;
    for (int32_t i = k / 2 - 1; i >= 0; i--) sift_down(idx, k, i, w);
    for (int32_t i = k; i < n; i++) {
        if (ranks_before(w, i, idx[0])) {
            idx[0] = i;
            sift_down(idx, k, 0, w);
        }
    }
    qsort_r(idx, (size_t) k, sizeof(int32_t), by_logit_desc, (void *) w);
}

rm_status rm_sampler_sample(rm_sampler * smp, const float * logits, int32_t n_vocab, const int32_t * recent,
                            int32_t n_recent, int32_t * out_token) {
    rm_clear_error();
    if (!smp || !logits || !out_token || n_vocab <= 0 || (n_recent > 0 && !recent)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_sampler_sample: bad argument (n_vocab %d, n_recent %d)", n_vocab, n_recent);
    }
    if (smp->cap < n_vocab) {
        float * w = realloc(smp->work, sizeof(float) * (size_t) n_vocab);
        if (w) smp->work = w;
        int32_t * ix = realloc(smp->idx, sizeof(int32_t) * (size_t) n_vocab);
        if (ix) smp->idx = ix;
        if (!w || !ix) {
            return rm_fail(RM_E_OOM, "rm_sampler_sample: out of memory");
        }
        smp->cap = n_vocab;
    }
    const rm_sampler_params * p = &smp->p;
    float * w = smp->work;
    memcpy(w, logits, sizeof(float) * (size_t) n_vocab);
    if (p->repeat_penalty != 1.0f && p->repeat_last_n > 0) {
        const int32_t from = n_recent > p->repeat_last_n ? n_recent - p->repeat_last_n : 0;
        for (int32_t i = from; i < n_recent; i++) {
            const int32_t t = recent[i];
            if (t < 0 || t >= n_vocab) continue;
            /* penalise each distinct token once */
            int seen = 0;
            for (int32_t j = from; j < i && !seen; j++) seen = recent[j] == t;
            if (!seen) w[t] = w[t] > 0.0f ? w[t] / p->repeat_penalty : w[t] * p->repeat_penalty;
        }
    }
    if (p->temperature <= 0.0f) {
        int32_t best = 0;
        for (int32_t i = 1; i < n_vocab; i++) {
            if (w[i] > w[best]) best = i;
        }
        *out_token = best;
        return RM_OK;
    }
    for (int32_t i = 0; i < n_vocab; i++) {
        w[i] /= p->temperature;
    }
    const int32_t n_keep = p->top_k > 0 && p->top_k < n_vocab ? p->top_k : n_vocab;
    top_k_ids(smp->idx, w, n_vocab, n_keep);
    int32_t n = n_keep;
    /* probabilities of the remaining candidates, in descending order */
    const float mx = w[smp->idx[0]];
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) total += exp((double) (w[smp->idx[i]] - mx));
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double) (w[smp->idx[i]] - mx)) / total;
            if (cum >= p->top_p) { keep = i + 1; break; }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        /* p_i >= min_p * p_max  <=>  logit_i - max >= log(min_p) */
        const float cut = logf(p->min_p);
        int32_t keep = 1;
        while (keep < n && w[smp->idx[keep]] - mx >= cut) keep++;
        n = keep;
    }
    total = 0.0;
    for (int32_t i = 0; i < n; i++) total += exp((double) (w[smp->idx[i]] - mx));
    double r = rm_rng_unit(&smp->state) * total;
    int32_t pick = smp->idx[n - 1];
    for (int32_t i = 0; i < n; i++) {
        r -= exp((double) (w[smp->idx[i]] - mx));
        if (r <= 0.0) { pick = smp->idx[i]; break; }
    }
    *out_token = pick;
    return RM_OK;
}
