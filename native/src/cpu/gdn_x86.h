/* gdn_x86.h - internal: the Gated DeltaNet layer's delta-rule step, its chunked form and the
 * causal conv in 256-bit vectors (rm_gdn_recurrent_fn, rm_gdn_chunked_fn, rm_gdn_conv_fn of
 * dispatch.h); their scalar twins are rm_gdn_recurrent, rm_gdn_chunked and rm_gdn_conv (cpu/gdn.c). Included by vec_dot_avx2.c and vec_dot_avx512.c,
 * so each set compiles them with its own flags. The same sums in the same order per lane as the
 * twins, with multiply-adds fused: the results agree to float rounding, not bit for bit. */
#ifndef RM_CPU_GDN_X86_H
#define RM_CPU_GDN_X86_H

#include <immintrin.h>
#include <math.h>

#include "gdn.h"

/* The recurrent form, eight value columns at a time: for each block of columns j, the decayed
 * state's rows give u = S^T k in one register, then S + k u^T and o = S^T q in a second pass.
 * d_v not a multiple of 8: the scalar twin. */
static void gdn_recurrent_x86(const rm_gdn_head * h, float * S) {
    const int32_t dk = h->d_k, dv = h->d_v;
    if (dv % 8 != 0) {
        rm_gdn_recurrent(h, S);
        return;
    }
    for (int32_t t = 0; t < h->n_tok; t++) {
        const float * q = h->q + t * h->qk_stride, * k = h->k + t * h->qk_stride, * v = h->v + t * h->v_stride;
        const __m256 decay = _mm256_set1_ps(expf(h->g[t * h->gb_stride])), beta = _mm256_set1_ps(h->beta[t * h->gb_stride]);
        float * o = h->o + t * h->o_stride;
        for (int32_t j = 0; j < dv; j += 8) {
            __m256 u = _mm256_setzero_ps();
            for (int32_t i = 0; i < dk; i++) {   /* S <- decay S; u = S^T k */
                float * row = S + (int64_t) i * dv + j;
                const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(row), decay);
                _mm256_storeu_ps(row, r);
                u = _mm256_fmadd_ps(r, _mm256_set1_ps(k[i]), u);
            }
            u = _mm256_mul_ps(beta, _mm256_sub_ps(_mm256_loadu_ps(v + j), u));
            __m256 acc = _mm256_setzero_ps();
            for (int32_t i = 0; i < dk; i++) {   /* S <- S + k u^T; o = S^T q */
                float * row = S + (int64_t) i * dv + j;
                const __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(k[i]), u, _mm256_loadu_ps(row));
                _mm256_storeu_ps(row, r);
                acc = _mm256_fmadd_ps(r, _mm256_set1_ps(q[i]), acc);
            }
            _mm256_storeu_ps(o + j, acc);
        }
    }
}

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

/* y[j] += a * x[j] for n floats, n a multiple of 8 */
static inline void gdn_axpy8(int32_t n, float a, const float * x, float * y) {
    const __m256 va = _mm256_set1_ps(a);
    for (int32_t j = 0; j < n; j += 8) {
        _mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
    }
}

/* One chunk of the chunked form (rm_gdn_chunked's steps, in the same order, eight value columns or
 * eight key dims at a time): the lower triangles of k k^T and q k^T, U = S0^T k and R = S0^T q,
 * the forward substitution, the outputs, then the state. */
static void gdn_chunk_x86(const rm_gdn_head * h, int32_t t0, int32_t c, float * S, float * scratch) {
    const int32_t dk = h->d_k, dv = h->d_v, C = RM_GDN_CHUNK;
    float * G = scratch, * KK = G + C, * QK = KK + C * C, * U = QK + C * C, * R = U + C * dv;
    const float * q0 = h->q + t0 * h->qk_stride, * k0 = h->k + t0 * h->qk_stride;
    float acc = 0.0f;
    for (int32_t t = 0; t < c; t++) {
        acc += h->g[(t0 + t) * h->gb_stride];
        G[t] = acc;
    }
    for (int32_t t = 0; t < c; t++) {
        const float * kt = k0 + t * h->qk_stride, * qt = q0 + t * h->qk_stride;
        for (int32_t s = 0; s <= t; s++) {
            const float * ks = k0 + s * h->qk_stride;
            __m256 akk = _mm256_setzero_ps(), aqk = _mm256_setzero_ps();
            for (int32_t i = 0; i < dk; i += 8) {
                const __m256 vs = _mm256_loadu_ps(ks + i);
                akk = _mm256_fmadd_ps(_mm256_loadu_ps(kt + i), vs, akk);
                aqk = _mm256_fmadd_ps(_mm256_loadu_ps(qt + i), vs, aqk);
            }
            KK[t * C + s] = gdn_hsum8(akk);
            QK[t * C + s] = gdn_hsum8(aqk);
        }
    }
    for (int32_t t = 0; t < c; t++) {   /* U = S0^T k, R = S0^T q: 16 columns per pass over S */
        const float * kt = k0 + t * h->qk_stride, * qt = q0 + t * h->qk_stride;
        float * ut = U + t * dv, * rt = R + t * dv;
        int32_t j = 0;
        for (; j + 16 <= dv; j += 16) {
            __m256 u0 = _mm256_setzero_ps(), u1 = _mm256_setzero_ps(), r0 = _mm256_setzero_ps(), r1 = _mm256_setzero_ps();
            for (int32_t i = 0; i < dk; i++) {
                const float * row = S + (int64_t) i * dv + j;
                const __m256 s0 = _mm256_loadu_ps(row), s1 = _mm256_loadu_ps(row + 8);
                const __m256 vk = _mm256_set1_ps(kt[i]), vq = _mm256_set1_ps(qt[i]);
                u0 = _mm256_fmadd_ps(s0, vk, u0);
                u1 = _mm256_fmadd_ps(s1, vk, u1);
                r0 = _mm256_fmadd_ps(s0, vq, r0);
                r1 = _mm256_fmadd_ps(s1, vq, r1);
            }
            _mm256_storeu_ps(ut + j, u0);
            _mm256_storeu_ps(ut + j + 8, u1);
            _mm256_storeu_ps(rt + j, r0);
            _mm256_storeu_ps(rt + j + 8, r1);
        }
        for (; j < dv; j += 8) {
            __m256 u0 = _mm256_setzero_ps(), r0 = _mm256_setzero_ps();
            for (int32_t i = 0; i < dk; i++) {
                const __m256 s0 = _mm256_loadu_ps(S + (int64_t) i * dv + j);
                u0 = _mm256_fmadd_ps(s0, _mm256_set1_ps(kt[i]), u0);
                r0 = _mm256_fmadd_ps(s0, _mm256_set1_ps(qt[i]), r0);
            }
            _mm256_storeu_ps(ut + j, u0);
            _mm256_storeu_ps(rt + j, r0);
        }
    }
    for (int32_t t = 0; t < c; t++) {   /* forward substitution for u_t */
        const float beta = h->beta[(t0 + t) * h->gb_stride];
        const __m256 vb = _mm256_set1_ps(beta), ve = _mm256_set1_ps(expf(G[t]));
        const float * vt = h->v + (t0 + t) * h->v_stride;
        float * ut = U + t * dv;
        for (int32_t j = 0; j < dv; j += 8) {
            const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(vt + j), _mm256_mul_ps(ve, _mm256_loadu_ps(ut + j)));
            _mm256_storeu_ps(ut + j, _mm256_mul_ps(vb, x));
        }
        for (int32_t s = 0; s < t; s++) {
            gdn_axpy8(dv, -(beta * KK[t * C + s] * expf(G[t] - G[s])), U + s * dv, ut);
        }
    }
    for (int32_t t = 0; t < c; t++) {   /* outputs */
        float * o = h->o + (t0 + t) * h->o_stride;
        const __m256 ve = _mm256_set1_ps(expf(G[t]));
        const float * rt = R + t * dv;
        for (int32_t j = 0; j < dv; j += 8) {
            _mm256_storeu_ps(o + j, _mm256_mul_ps(ve, _mm256_loadu_ps(rt + j)));
        }
        for (int32_t s = 0; s <= t; s++) {
            gdn_axpy8(dv, QK[t * C + s] * expf(G[t] - G[s]), U + s * dv, o);
        }
    }
    const __m256 vc = _mm256_set1_ps(expf(G[c - 1]));   /* the state after the chunk */
    for (int32_t i = 0; i < dk; i++) {
        float * row = S + (int64_t) i * dv;
        for (int32_t j = 0; j < dv; j += 8) {
            _mm256_storeu_ps(row + j, _mm256_mul_ps(vc, _mm256_loadu_ps(row + j)));
        }
    }
    for (int32_t s = 0; s < c; s++) {
        const float * ks = k0 + s * h->qk_stride;
        const float * us = U + s * dv;
        const float e = expf(G[c - 1] - G[s]);
        for (int32_t i = 0; i < dk; i++) {
            gdn_axpy8(dv, e * ks[i], us, S + (int64_t) i * dv);
        }
    }
}

/* The chunked form (rm_gdn_chunked's twin); key or value dims not a multiple of 8: the twin. */
static void gdn_chunked_x86(const rm_gdn_head * h, float * S, float * scratch) {
    if (h->d_k % 8 != 0 || h->d_v % 8 != 0) {
        rm_gdn_chunked(h, S, scratch);
        return;
    }
    for (int32_t t0 = 0; t0 < h->n_tok; t0 += RM_GDN_CHUNK) {
        gdn_chunk_x86(h, t0, h->n_tok - t0 < RM_GDN_CHUNK ? h->n_tok - t0 : RM_GDN_CHUNK, S, scratch);
    }
}

#endif
