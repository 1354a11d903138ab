/* attention.h - internal: the plain attention layer (full, sliding-window, with sinks, gated), the
 * layer kind of most families; multi-head latent attention is mla.h's, Gated DeltaNet deltanet.h's. */
#ifndef RM_ATTENTION_H
#define RM_ATTENTION_H

#include "session.h"

/* x += Wo attn(x) for layer il over the n rows of the step's sequences (s->runs), each over its
 * own session's KV cache. */
void rm_attention_block(rm_session * s, int il, int32_t n);

/* A layer's attention shape: its query and kv heads, key and value head widths, rotary dims and
 * RoPE base (a sliding layer may have its own: Gemma 4's, Step-3.5's). */
typedef struct rm_attn_shape {
    int32_t n_head_kv, head_dim, head_dim_v, n_rot;
    float   rope_base;
    int32_t n_head;
} rm_attn_shape;

static inline rm_attn_shape rm_attn_shape_of(const rm_hparams * hp, uint32_t kind) {
    const int slides = (kind & RM_LAYER_ATTN_SLIDING) != 0;
    const int32_t dv = hp->head_dim_v > 0 ? hp->head_dim_v : hp->head_dim;
    return (rm_attn_shape) {slides ? hp->n_head_kv_swa : hp->n_head_kv, slides ? hp->head_dim_swa : hp->head_dim,
                            slides ? rm_head_dim_v_swa(hp->head_dim, dv, hp->head_dim_swa) : dv,
                            slides ? hp->n_rot_swa : hp->n_rot, slides ? hp->rope_base_swa : hp->rope_base,
                            slides && hp->n_head_swa > 0 ? hp->n_head_swa : hp->n_head};
}

/* Where layer il's cache lies in session s's K and V buffers. A sliding-window layer keeps only
 * the last rm_kv_ring_rows positions, position p in row p % ring; other layers keep n_ctx (ring
 * 0); a linear-attention layer keeps none (rows 0). Rows are the layer's width (its kv heads
 * times its key or value head width, MLA's latent) in the cache's type. The same layout as sizes.c's byte
 * count. */
typedef struct rm_kv_place {
    uint64_t k_off, v_off;        /* bytes into k_cache and v_cache */
    uint64_t k_row, v_row;        /* bytes of one position (v_row 0: MLA keeps no V) */
    int32_t  rows, ring;
} rm_kv_place;

/* The n new rows of x (width floats each) into a cache at positions pos.. (wrapping round a ring of
 * `ring` rows, 0: none; n <= ring, so at most once), as rows of row_bytes of type: F32 copied, others
 * converted row by row (the CPU backend alone has them: host memory). */
void rm_cache_append(rm_session * s, void * cache, int32_t type, uint64_t row_bytes, const float * x, int32_t n,
                     int64_t width, int32_t ring, int32_t pos);

/* Fills s->kv_at (n_layer places) once its sizes, cache types and hybrid state are set. */
void rm_attention_kv_layout(rm_session * s);

static inline rm_kv_place rm_attention_kv_place(const rm_session * s, int il) { return s->kv_at[il]; }

#endif
