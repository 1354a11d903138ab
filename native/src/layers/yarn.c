/* yarn.c - what gpt-oss adds to the attention and expert math, as host reference functions: RoPE
 * with YaRN's context extension, the softmax with a sink, and the clamped SwiGLU. The CPU backend
 * calls them directly; the CUDA kernels (rope.cu, attention.cu, swiglu.cu) compute the same
 * expressions and native/tests/test_backend_ops.c holds the backends to them. */
#include <math.h>

#include "backend.h"

/* The dim at which a frequency turns n_turns times over the original context (YaRN, eq. 17). */
static float corr_dim(int32_t n_rot, int32_t n_ctx_orig, float n_turns, float base) {
    return (float) n_rot * logf((float) n_ctx_orig / (n_turns * 2.0f * (float) M_PI)) / (2.0f * logf(base));
}

/* As ggml_rope_yarn_corr_dims and transformers' _compute_yarn_parameters: the correction range
 * from beta_fast (fewer turns: the low dims) to beta_slow, rounded outwards to whole dims unless
 * the file says not to (transformers' `truncate`, which llama.cpp does not have and always takes
 * as true), then clipped to [0, n_rot - 1]. mscale is transformers' attention_factor,
 * 1 + 0.1 ln(factor), the product llama.cpp's attn_factor and ext_factor make. */
void rm_rope_yarn_of(const rm_hparams * hp, rm_rope_yarn * out) {
    const float factor = hp->rope_yarn_factor > 0.0f ? hp->rope_yarn_factor : 1.0f;
    float lo = corr_dim(hp->n_rot, hp->n_ctx_orig_yarn, hp->yarn_beta_fast, hp->rope_base);
    float hi = corr_dim(hp->n_rot, hp->n_ctx_orig_yarn, hp->yarn_beta_slow, hp->rope_base);
    if (hp->yarn_truncate) {
        lo = floorf(lo);
        hi = ceilf(hi);
    }
    out->base = hp->rope_base;
    out->freq_scale = 1.0f / factor;
    out->corr_lo = lo > 0.0f ? lo : 0.0f;
    out->corr_hi = hi < (float) (hp->n_rot - 1) ? hi : (float) (hp->n_rot - 1);
    out->mscale = factor > 1.0f ? 1.0f + 0.1f * logf(factor) : 1.0f;
}

void rm_rope_yarn_row(float * x, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t pos, const rm_rope_yarn * y,
                      int neox) {
    const int32_t half = n_rot / 2;
    const float width = y->corr_hi - y->corr_lo > 0.001f ? y->corr_hi - y->corr_lo : 0.001f;
    for (int32_t i = 0; i < half; i++) {
        const float inv_extrap = 1.0f / powf(y->base, (float) (2 * i) / (float) n_rot);
        const float r = ((float) i - y->corr_lo) / width;
        const float keep = 1.0f - (r < 0.0f ? 0.0f : r > 1.0f ? 1.0f : r);   /* 1: the original frequency */
        const float inv_freq = inv_extrap * y->freq_scale * (1.0f - keep) + inv_extrap * keep;
        const float angle = (float) pos * inv_freq;
        rm_rope_turn(x, n_head, head_dim, n_rot, i, cosf(angle) * y->mscale, sinf(angle) * y->mscale, neox);
    }
}

void rm_swiglu_clamp_ref(float * g, const float * u, int64_t n, float alpha, float limit) {
    if (alpha == 0.0f) {   /* the limited SwiGLU */
        for (int64_t j = 0; j < n; j++) {
            const float s = g[j] / (1.0f + expf(-g[j]));
            const float y = u[j] < -limit ? -limit : u[j] > limit ? limit : u[j];
            g[j] = (s < limit ? s : limit) * y;
        }
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        const float x = g[j] < limit ? g[j] : limit;
        const float y = u[j] < -limit ? -limit : u[j] > limit ? limit : u[j];
        g[j] = alpha < 0.0f ? x / (1.0f + expf(-x)) * y : x / (1.0f + expf(-alpha * x)) * (y + 1.0f);
    }
}

void rm_softmax_sink(float * x, int64_t n, float sink) {
    float mx = sink;
    for (int64_t i = 0; i < n; i++) {
        mx = x[i] > mx ? x[i] : mx;
    }
    double sum = (double) expf(sink - mx);
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    const float inv = (float) (1.0 / sum);
    for (int64_t i = 0; i < n; i++) {
        x[i] *= inv;
    }
}
