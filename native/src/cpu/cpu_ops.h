/* cpu_ops.h - internal to cpu/: the CPU backend's larger ops, each in a file of its own, which
 * ops.c puts in its table (backend.h says what each does). */
#ifndef RM_CPU_OPS_H
#define RM_CPU_OPS_H

#include "backend.h"
#include "threads.h"

/* cpu/mla.c: multi-head latent attention's core on the pool's threads (be: for its matmul_many). */
void rm_cpu_mla_attention(rm_backend * be, rm_pool * pool, const rm_mla_args * a);

/* cpu/dsa.c: sparse attention's pick of positions on the pool's threads, and a LayerNorm. */
void rm_cpu_dsa_select(rm_pool * pool, const rm_dsa_args * a);
/* The k-th largest of v[0..n) (1 <= k <= n), v reordered. */
float rm_cpu_kth_largest(float * v, int32_t n, int32_t k);
/* The indices of the k largest of scores[0..n) (1 <= k <= n) into out, in increasing order, the
 * earlier of equal scores first; copy: room for n floats. */
void rm_cpu_top_k(const float * scores, float * copy, int32_t n, int32_t k, int32_t * out);
void rm_cpu_layernorm(float * y, const float * x, const float * w, const float * b, int64_t n_rows, int64_t n,
                      float eps);

/* cpu/qsa.c: QSA's pick of key blocks on the pool's threads. */
void rm_cpu_qsa_select(rm_pool * pool, const rm_qsa_args * a);

/* cpu/ple.c: PLE's gate and its dilated conv on the pool's threads. */
void rm_cpu_ple_gate(rm_pool * pool, float * out, const float * key, const float * query, const float * value,
                     int64_t n_tok, int64_t hc, int64_t n);
void rm_cpu_ple_conv(rm_pool * pool, const rm_ple_conv_args * a);

/* cpu/mhc.c: DeepSeek-V4's hyper-connections' weights, the streams' weighted sum and a block's
 * output into the streams, on the pool's threads (backend.h's mhc_weights, mhc_collapse, mhc_expand). */
void rm_cpu_mhc_weights(rm_pool * pool, float * mix, const float * scale, const float * base, int64_t n_tok,
                        int64_t hc, int64_t n_mix, int32_t iters, float eps);
void rm_cpu_mhc_collapse(rm_pool * pool, float * y, const float * h, const float * mix, int64_t n_mix, int64_t n_tok,
                         int64_t hc, int64_t n);
void rm_cpu_mhc_expand(rm_pool * pool, float * h, const float * b, const float * mix, int64_t n_tok, int64_t hc,
                       int64_t n);

/* cpu/dsv4_attn.c: DeepSeek-V4's attention core on the pool's threads. */
void rm_cpu_dsv4_attention(rm_pool * pool, const rm_dsv4_attn_args * a);

/* cpu/csa.c: DeepSeek-V4's CSA pick of compressed entries on the pool's threads. */
void rm_cpu_csa_select(rm_pool * pool, const rm_csa_args * a);

/* cpu/compress.c: DeepSeek-V4's compressed entries on the pool's threads (backend.h's compress). */
void rm_cpu_compress(rm_pool * pool, const rm_compress_args * a);

/* cpu/deltanet.c: the middle of a Gated DeltaNet layer on the pool's threads. */
void rm_cpu_gdn(rm_pool * pool, const rm_gdn_args * a);

#endif
