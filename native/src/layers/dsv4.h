/* dsv4.h - internal: DeepSeek-V4's attention layer (RM_LAYER_MHC; with RM_LAYER_CSA or
 * RM_LAYER_HCA its compressed entries): one key head that is also the value over a sliding window,
 * the entries of the layer's compressor beside it (HCA: all of them; CSA: those its lightning
 * indexer picks), sinks, the turn back of the output's RoPE, a grouped output projection.
 *
 * A session keeps, beside the window's ring in its K cache, per compressor (the attention's and a
 * CSA layer's indexer's) the projections of the last positions in a ring (a window's ratio rows,
 * with the window before it for CSA's overlapping series) and its entries (window w in row w).
 * Everything is indexed by position, so the state at n_past is what the rows at the positions
 * before it left: a position's rows are written where that position's are read. */
#ifndef RM_DSV4_H
#define RM_DSV4_H

#include "session.h"

typedef struct rm_dsv4_comp {
    float * kv, * gate;           /* backend: ring rows of the kv and gate projections (position p in row p % ring) */
    float * entries;              /* backend: n_ctx / ratio rows of head_dim */
    int32_t ring, ratio, width, head_dim;
} rm_dsv4_comp;

typedef struct rm_dsv4 {
    rm_dsv4_comp * comp;          /* per layer: [2 il] its compressor's, [2 il + 1] its indexer's (width 0: none) */
    rm_rope_yarn   yarn;          /* the compressed layers' RoPE with YaRN, where has_yarn (the model's, made once) */
    int            has_yarn;
    /* the step's scratch (backend) */
    float * q_res;                /* n_batch rows of q_lora_rank */
    float * o_mid;                /* n_batch rows of o_groups * o_lora_rank */
    float * ckv, * cgate;         /* n_batch rows of the compressor's kv and gate projections (2 head_dim) */
    float * ikv, * igate;         /* n_batch rows of the indexer's (2 index_head_dim) */
    float * iq;                   /* n_batch rows of index_n_head * index_head_dim */
    float * iw;                   /* n_batch rows of index_n_head */
    /* host */
    int32_t * sel;                /* n_batch rows of index_top_k */
    float *   csa_host;           /* rm_csa_host_floats */
    float *   attn_host;          /* rm_dsv4_attn_host_floats */
} rm_dsv4;

/* s->dsv4 for a DeepSeek-V4 model (else left NULL); 0 when out of memory or the backend runs no
 * DeepSeek-V4 attention (error set). */
int  rm_dsv4_new(rm_session * s);
void rm_dsv4_free(rm_session * s);

/* The compressors' state of n_past positions as a session state holds it: per compressor its rings
 * whole, then its first n_past / ratio entries. save writes them at `at` and returns the end; load
 * reads them (a state of the same model: the rings' sizes are the model's). */
uint64_t        rm_dsv4_state_bytes(const rm_session * s, int32_t n_past);
uint8_t *       rm_dsv4_state_save(const rm_session * s, uint8_t * at);
const uint8_t * rm_dsv4_state_load(rm_session * s, const uint8_t * at, int32_t n_past);

/* Whether the compressors' rings still hold the rows that position n_keep continues from (its
 * window's, and for CSA the window's before it); the entries of the windows before n_keep are
 * kept whatever the session held after. il: the first layer that does not. */
int rm_dsv4_keeps(const rm_session * s, int32_t n_keep, int * il);

/* x += the attention of layer il over the step's n rows of xn (the streams' mix, normed), each run
 * on its own session's window and compressors. */
void rm_dsv4_block(rm_session * s, int il, int32_t n);

#endif
