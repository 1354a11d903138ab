/* gdn_x86.h - internal: the Gated DeltaNet layer's delta rule and causal conv in 256-bit vectors
 * (rm_gdn_rule_fn, rm_gdn_conv_fn of dispatch.h); their scalar twins are rm_gdn_rule and
 * rm_gdn_conv (cpu/gdn.c). Included by vec_dot_avx2.c and vec_dot_avx512.c, so each set compiles
 * them with its own flags. The same sums in the same order per lane as the twins, with
 * multiply-adds fused: the results agree to float rounding, not bit for bit. */
#ifndef RM_CPU_GDN_X86_H
#define RM_CPU_GDN_X86_H

#include <immintrin.h>
#include <math.h>

#include "gdn.h"

/* The causal conv, eight channels at a time with their taps in registers (d_conv <= 8); silu on
 * the sums as the twin computes it. Other shapes: the scalar twin. */
static void gdn_conv_x86(float * out, const float * x, int32_t n_tok, int64_t n_ch, int64_t stride, float * state,
                         const float * w, int32_t d_conv) {
    if (n_ch % 8 != 0 || d_conv < 1 || d_conv > 8) {
        rm_gdn_conv(out, x, n_tok, n_ch, stride, state, w, d_conv);
        return;
    }
    const int32_t hist = d_conv - 1;
    for (int64_t c = 0; c < n_ch; c += 8) {
        __m256 taps[8];
        for (int32_t i = 0; i < d_conv; i++) {
            taps[i] = _mm256_set_ps(w[(c + 7) * d_conv + i], w[(c + 6) * d_conv + i], w[(c + 5) * d_conv + i],
                                    w[(c + 4) * d_conv + i], w[(c + 3) * d_conv + i], w[(c + 2) * d_conv + i],
                                    w[(c + 1) * d_conv + i], w[c * d_conv + i]);
        }
        for (int32_t t = 0; t < n_tok; t++) {
            __m256 acc = _mm256_setzero_ps();
            for (int32_t i = 0; i < d_conv; i++) {
                const int32_t src = t - hist + i;   /* < 0: from the state */
                const float * xs = src < 0 ? state + (int64_t) (hist + src) * stride : x + (int64_t) src * stride;
                acc = _mm256_fmadd_ps(taps[i], _mm256_loadu_ps(xs + c), acc);
            }
            float * y = out + (int64_t) t * stride + c;
            _mm256_storeu_ps(y, acc);
            for (int l = 0; l < 8; l++) {
                y[l] = y[l] / (1.0f + expf(-y[l]));
            }
        }
    }
    rm_gdn_conv_keep(x, n_tok, n_ch, stride, state, hist);
}

/* hsum of eight floats */
static inline float gdn_hsum8(__m256 v) {
    const __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
}

/* ---- the delta rule's vector steps (gdn_rule.h) eight floats at a time: n, d_k and d_v are
 * multiples of 8 here (gdn_rule_x86 sends other shapes to the twin) ---- */

static inline float gdn_dot8(const float * a, const float * b, int32_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int32_t i = 0; i < n; i += 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    }
    return gdn_hsum8(acc);
}

/* u = S^T k, r = S^T q: 16 columns per pass over S */
static inline void gdn_matvec2_8(const float * S, const float * k, const float * q, int32_t dk, int32_t dv, float * u,
                                 float * r) {
    int32_t j = 0;
    for (; j + 16 <= dv; j += 16) {
        __m256 u0 = _mm256_setzero_ps(), u1 = _mm256_setzero_ps(), r0 = _mm256_setzero_ps(), r1 = _mm256_setzero_ps();
        for (int32_t i = 0; i < dk; i++) {
            const float * row = S + (int64_t) i * dv + j;
            const __m256 s0 = _mm256_loadu_ps(row), s1 = _mm256_loadu_ps(row + 8);
            const __m256 vk = _mm256_set1_ps(k[i]), vq = _mm256_set1_ps(q[i]);
            u0 = _mm256_fmadd_ps(s0, vk, u0);
            u1 = _mm256_fmadd_ps(s1, vk, u1);
            r0 = _mm256_fmadd_ps(s0, vq, r0);
            r1 = _mm256_fmadd_ps(s1, vq, r1);
        }
        _mm256_storeu_ps(u + j, u0);
        _mm256_storeu_ps(u + j + 8, u1);
        _mm256_storeu_ps(r + j, r0);
        _mm256_storeu_ps(r + j + 8, r1);
    }
    for (; j < dv; j += 8) {
        __m256 u0 = _mm256_setzero_ps(), r0 = _mm256_setzero_ps();
        for (int32_t i = 0; i < dk; i++) {
            const __m256 s0 = _mm256_loadu_ps(S + (int64_t) i * dv + j);
            u0 = _mm256_fmadd_ps(s0, _mm256_set1_ps(k[i]), u0);
            r0 = _mm256_fmadd_ps(s0, _mm256_set1_ps(q[i]), r0);
        }
        _mm256_storeu_ps(u + j, u0);
        _mm256_storeu_ps(r + j, r0);
    }
}

static inline void gdn_urow8(int32_t n, float beta, float e, const float * v, float * u) {
    const __m256 vb = _mm256_set1_ps(beta), ve = _mm256_set1_ps(e);
    for (int32_t j = 0; j < n; j += 8) {
        const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(v + j), _mm256_mul_ps(ve, _mm256_loadu_ps(u + j)));
        _mm256_storeu_ps(u + j, _mm256_mul_ps(vb, x));
    }
}

static inline void gdn_scale8(int32_t n, float a, const float * x, float * y) {
    const __m256 va = _mm256_set1_ps(a);
    for (int32_t j = 0; j < n; j += 8) {
        _mm256_storeu_ps(y + j, _mm256_mul_ps(va, _mm256_loadu_ps(x + j)));
    }
}

static inline void gdn_axpy8(int32_t n, float a, const float * x, float * y) {
    const __m256 va = _mm256_set1_ps(a);
    for (int32_t j = 0; j < n; j += 8) {
        _mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
    }
}

#define GDN_RULE_NAME gdn_rule_x86_8
#define GDN_DOT       gdn_dot8
#define GDN_MATVEC2   gdn_matvec2_8
#define GDN_UROW      gdn_urow8
#define GDN_SCALE     gdn_scale8
#define GDN_AXPY      gdn_axpy8
#include "gdn_rule.h"

/* The delta rule (rm_gdn_rule's twin); key or value dims not a multiple of 8: the twin. */
static void gdn_rule_x86(const rm_gdn_head * h, int32_t pos, float * state, float * scratch) {
    if (h->d_k % 8 != 0 || h->d_v % 8 != 0) {
        rm_gdn_rule(h, pos, state, scratch);
        return;
    }
    gdn_rule_x86_8(h, pos, state, scratch);
}

#endif
