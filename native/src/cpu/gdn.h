/* gdn.h - the host math of a Gated DeltaNet layer (Qwen3-Next, Qwen3.5): the short causal
 * convolution with its rolling state, L2 normalisation, the gated delta rule in position-aligned
 * chunks, and the gated RMSNorm. Plain float loops over host arrays; deltanet.c calls
 * them on the CPU backend's activations.
 *
 * The delta rule of one value head, with state S (d_k x d_v, row-major: S[i*d_v + j]) and, per
 * token t, a key k_t and query q_t (d_k, L2-normalised, q_t also scaled by 1/sqrt(d_k)), a value
 * v_t (d_v), a log-decay g_t <= 0 and a write strength beta_t in (0, 1):
 *
 *     S <- exp(g_t) S;   u_t = beta_t (v_t - S^T k_t);   S <- S + k_t u_t^T;   o_t = S^T q_t
 *
 * It is computed in chunks of C = RM_GDN_CHUNK tokens aligned to cache positions (chunk j holds
 * positions [jC, (j+1)C)): with G_t the cumulative log-decay inside the chunk and S0 the state at
 * its start,
 *
 *     u_t = beta_t (v_t - e^{G_t} S0^T k_t) - sum_{s<t} beta_t (k_t . k_s) e^{G_t - G_s} u_s
 *     o_t = e^{G_t} S0^T q_t + sum_{s<=t} (q_t . k_s) e^{G_t - G_s} u_s
 *     S   = e^{G_C} S0 + sum_s e^{G_C - G_s} k_s u_s^T        (once the chunk is complete)
 *
 * (the triangular system for u solved by forward substitution). Token t's output takes the same
 * operations on the same operands (S0 and the chunk's rows before it) however the tokens arrive:
 * a whole prompt, a prompt cut into steps anywhere, or one token at a time. So a sequence gets the
 * same floats alone, in a batch, in prefill and in decode. Between calls a head keeps S0 and the
 * rows of the unfinished chunk (rm_gdn_state_floats). */
#ifndef RM_CPU_GDN_H
#define RM_CPU_GDN_H

#include <stdint.h>

#include "backend.h"   /* RM_GDN_CHUNK, rm_gdn_state_floats, rm_gdn_chunk_scratch: the states' layout */


/* out[t][c] = silu(sum_i w[c][i] * x_{t - d_conv + 1 + i}[c]) for n_tok rows of n_ch channels,
 * where rows before the first come from state ((d_conv - 1) rows, oldest first); state then holds
 * the last d_conv - 1 inputs. Rows of out, x and state lie stride floats apart (stride >= n_ch: a
 * slice of the channels, so threads can take slices). w: n_ch rows of d_conv taps
 * (ne = {d_conv, n_ch}). */
void rm_gdn_conv(float * out, const float * x, int32_t n_tok, int64_t n_ch, int64_t stride, float * state,
                 const float * w, int32_t d_conv);

/* state <- the last hist = d_conv - 1 rows of (state, then the n_tok rows of x), n_ch channels
 * of rows stride floats apart: rm_gdn_conv's update of its state, shared with its vector forms. */
void rm_gdn_conv_keep(const float * x, int32_t n_tok, int64_t n_ch, int64_t stride, float * state, int32_t hist);

/* x <- x / sqrt(sum x^2 + eps) * scale, for n_rows rows of n, rows stride floats apart. */
void rm_gdn_l2norm(float * x, int64_t n_rows, int64_t stride, int64_t n, float eps, float scale);

/* The inputs of one value head over n_tok tokens: row t of q and k at q + t*qk_stride, of v at
 * v + t*v_stride, the output at o + t*o_stride; g and beta at t*gb_stride. */
typedef struct rm_gdn_head {
    const float * q, * k;
    int64_t       qk_stride;
    const float * v;
    int64_t       v_stride;
    const float * g, * beta;
    int64_t       gb_stride;
    float *       o;
    int64_t       o_stride;
    int32_t       n_tok, d_k, d_v;
} rm_gdn_head;

/* The n_tok tokens of h at cache positions pos, pos + 1, ... (the state holds positions < pos,
 * laid out as rm_gdn_state_floats says): outputs into h->o, state advanced. scratch holds
 * rm_gdn_chunk_scratch(d_k, d_v) floats. */
void    rm_gdn_rule(const rm_gdn_head * h, int32_t pos, float * state, float * scratch);

/* y <- rmsnorm(y) * w * act(z) over n_rows rows of n (the value heads' outputs), act sigmoid when
 * `sigmoid` is nonzero, else silu. */
void rm_gdn_gated_norm(float * y, const float * z, const float * w, int64_t n_rows, int64_t n, float eps,
                       int sigmoid);

#endif
