/* ops.c - the CPU backend: matrix products over quantized weights, attention, small ops.
 *
 * Matrix products follow ggml: activations are quantized once to the weight type's vec_dot_type
 * (Q8_0 / Q8_K blocks), then weight rows are dotted against every token's row while they are hot
 * in cache. The kernels are the best set this CPU runs (dispatch.c). Rows go in tiles of a few
 * KiB of weights: a tile stays in L1 while every token of the batch passes over it, so prefill
 * reads each weight byte from memory once, and tokens pass four at a time where the type has a
 * four-token kernel (each weight block is then unpacked once for four). Threads take tiles from
 * a shared counter rather than fixed shares, and the pool's shared runs (threads.c) let a core
 * busy with other work miss a product instead of holding it up. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "devweights.h"
#include "gating.h"
#include "status.h"
#include "types.h"
#include "cpu_ops.h"
#include "dispatch.h"

/* Threads take rows in chunks from a shared counter. With one to three tokens a product streams
 * its weights from memory once, and long runs keep the hardware prefetchers going: chunks of
 * about 256 KiB, two per thread (16 KiB chunks ran decode at half the speed). With more tokens it
 * is compute-bound and balance matters more: about 16 KiB, at least four per thread. Within a
 * chunk, rows go in tiles of about MM_TILE_BYTES, which stay in L1 while every token of the batch
 * passes over them. */
#define MM_STREAM_CHUNK_BYTES (256 << 10)
#define MM_STREAM_CHUNKS_PER_THREAD 2
#define MM_BATCH_CHUNK_BYTES (16 << 10)
#define MM_BATCH_CHUNKS_PER_THREAD 4
#define MM_TILE_BYTES (16 << 10)
/* The prefill form (rm_packed_kernels): used from this many tokens on, each thread packing rows
 * into MM_PACK_BYTES of its own. */
#define MM_PACK_MIN_TOKENS RM_PACK_MIN_TOKENS
#define MM_PACK_BYTES (24 << 10)

/* A product's chunks, dealt in shares. Streaming (one to three tokens), each thread first takes
 * the chunks of its own contiguous share in order, then helps with the others' from their ends'
 * counters: a thread reads one long run of weights, which the prefetchers follow, instead of
 * every other chunk (the Q8_0 output head streamed 26 GB/s in alternate 256 KiB chunks against
 * 29 GB/s in two halves, two threads). A thread that misses the task (rm_pool_run_shared) has its
 * share taken by the others. Compute-bound products deal one share, taken by all. */
#define MM_MAX_SHARES 64

typedef struct mm_deal {
    struct {
        _Alignas(64) atomic_llong next;   /* the share's next chunk */
        int64_t end;                      /* one past its last */
    } share[MM_MAX_SHARES];
    int n_shares;
} mm_deal;

static void deal_init(mm_deal * d, int64_t n_chunks, int n_shares) {
    n_shares = n_shares < 1 ? 1 : n_shares > MM_MAX_SHARES ? MM_MAX_SHARES : n_shares;
    if (n_chunks < n_shares) {
        n_shares = n_chunks > 0 ? (int) n_chunks : 1;
    }
    d->n_shares = n_shares;
    for (int s = 0; s < n_shares; s++) {
        atomic_init(&d->share[s].next, n_chunks * s / n_shares);
        d->share[s].end = n_chunks * (s + 1) / n_shares;
    }
}

/* Thread ith's next chunk, or -1 when every share is done. *from: how many shares past its own
 * it has come (start it at 0); a thread visits its own share first, then the others in turn. */
static int64_t deal_next(mm_deal * d, int ith, int * from) {
    const int n = d->n_shares;
    for (; *from < n; ++*from) {
        const int s = (ith + *from) % n;
        if (atomic_load_explicit(&d->share[s].next, memory_order_relaxed) >= d->share[s].end) {
            continue;
        }
        const int64_t k = atomic_fetch_add_explicit(&d->share[s].next, 1, memory_order_relaxed);
        if (k < d->share[s].end) {
            return k;
        }
    }
    return -1;
}

typedef struct cpu_ctx {
    rm_pool * pool;
    uint8_t * xq;                 /* quantized activations: n_batch rows of up to max_in */
    uint64_t  xq_cap;
    float *   x_info;             /* their block scales and sums (rm_q8_0_act_info) */
    int64_t   x_info_cap;         /* floats */
    float *   scores;             /* attention: per thread, a tile's scores */
    int64_t   scores_room;        /* floats per thread: ATTN_ROWS rows of ATTN_TILE, and a cache line */
    float *   attn_own;           /* attention's scratch where a call brings none */
    int64_t   attn_own_floats;
    uint8_t * xt;                 /* transposed activations for the prefill form: n_batch rows */
    uint64_t  xt_cap;
    uint8_t * pack;               /* each thread's packed rows: pack_stride bytes apiece */
    uint64_t  pack_stride;        /* MM_PACK_BYTES, or more where a tile kernel needs it */
    const rm_dev_weights * repacked;   /* the model's weights in the kernels' stored layout, or NULL */
    struct many_task * many;      /* matmul_many's state */
    uint8_t * xq_many;            /* its quantized activations: two types of n_batch rows */
    uint64_t  xq_many_cap;
    uint8_t * xt_many;            /* and their transposed copies */
    uint64_t  xt_many_cap;
    float *   x_info_many;
    int64_t   x_info_many_cap;
    int32_t * scatter;            /* scatter_add's sources by destination row */
    int64_t   scatter_cap;        /* int32s */
} cpu_ctx;

typedef struct mm_task {
    const rm_matmul_args * a;
    rm_vec_dot_fn          vec_dot;    /* the weight type's kernel */
    rm_vec_dot_multi_fn    vec_dot_multi; /* and its multi-token form, or NULL */
    rm_from_float_fn       quantize;   /* its activation type's quantizer */
    const uint8_t *        wdata;
    const uint8_t *        xq;
    uint64_t               xq_stride;
    const float *          x_info;     /* Q8_0 activations: block scales and sums, or NULL */
    int64_t                x_info_stride;
    const rm_packed_kernels * pk;      /* the prefill form, when this product uses it */
    uint8_t *              xt;         /* the transposed activations it needs */
    uint64_t               xt_stride;
    uint8_t *              pack;       /* the threads' packing room */
    uint64_t               pack_stride;
    const rm_tile_kernels * tk;        /* the tile form (AMX), when this product uses it: xt is its layout */
    const uint8_t *        stored;     /* the matrix in the stored layout (repack.h), or NULL */
    int64_t                chunk_rows;
    int64_t                tile_rows;
    int64_t                n_chunks;
    int                    burst;       /* streaming to a kernel that does not prefetch: a row's lines
                                           asked for ahead (rm_prefetch_row_ahead) before each row */
    mm_deal *              deal;        /* who takes which chunk */
    atomic_llong           next_token;  /* the quantizers' next unit (quant_units) */
} mm_task;

static void quantize_rows(const mm_task * t, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        uint8_t * xq = (uint8_t *) t->xq + i * t->xq_stride;
        t->quantize(t->a->x + i * t->a->x_stride, xq, t->a->w->ne[0]);
        if (t->x_info) {
            rm_q8_0_act_info(xq, t->a->w->ne[0], (float *) t->x_info + i * t->x_info_stride);
        }
        if (t->xt && !t->tk) {
            t->pk->transpose_act(t->a->w->ne[0], xq, t->xt + i * t->xt_stride);
        }
    }
}

/* The quantizers' units of work: a token, or for the tile form a group of RM_TILE_TOKENS tokens,
 * quantized and then laid out together. */
static int64_t quant_units(const mm_task * t) {
    return t->tk ? (t->a->n_tok + RM_TILE_TOKENS - 1) / RM_TILE_TOKENS : t->a->n_tok;
}

static void quantize_unit(const mm_task * t, int64_t u) {
    if (!t->tk) {
        quantize_rows(t, u, u + 1);
        return;
    }
    const int64_t i0 = u * RM_TILE_TOKENS, i1 = i0 + RM_TILE_TOKENS < t->a->n_tok ? i0 + RM_TILE_TOKENS : t->a->n_tok;
    quantize_rows(t, i0, i1);
    t->tk->put_group(t->a->w->ne[0], (const uint8_t *) t->xq + (uint64_t) i0 * t->xq_stride, t->xq_stride, (int32_t) i0, (int32_t) (i1 - i0),
                     t->xt);
}

static void quantize_task(void * p, int ith, int nth) {
    mm_task * t = p;
    for (;;) {
        const int64_t u = atomic_fetch_add_explicit(&t->next_token, 1, memory_order_relaxed);
        if (u >= quant_units(t)) {
            break;
        }
        quantize_unit(t, u);
    }
    (void) ith;
    (void) nth;
}

static inline void store(const rm_matmul_args * a, int32_t i, int64_t r, float v) {
    float * y = a->y + (int64_t) i * a->y_stride + r;
    *y = a->accumulate ? *y + v : v;
}

/* matmul_tile in the prefill form: the rows packed once into this thread's room, as many at a
 * time as fit, then every token passes over them. */
static void matmul_tile_packed(const mm_task * t, int ith, int64_t r0, int64_t r1) {
    const rm_matmul_args * a = t->a;
    const int64_t n_in = a->w->ne[0];
    const uint64_t rb = a->w->row_bytes, pb = t->pk->packed_bytes(n_in);
    uint8_t * room = t->pack + (uint64_t) ith * t->pack_stride;
    /* the blocks past the last group: a stored row keeps them where the file has them */
    const uint8_t * raw = t->stored ? t->stored : t->wdata;
    const int64_t fit = (int64_t) (MM_PACK_BYTES / pb) > 0 ? (int64_t) (MM_PACK_BYTES / pb) : 1;
    for (int64_t s0 = r0; s0 < r1; s0 += fit) {
        const int64_t s1 = s0 + fit < r1 ? s0 + fit : r1;
        for (int64_t r = s0; r < s1; r++) {
            if (t->stored) {
                t->pk->unpack_stored(n_in, t->stored + (uint64_t) r * rb, room + (uint64_t) (r - s0) * pb);
            } else {
                t->pk->pack_row(n_in, t->wdata + (uint64_t) r * rb, room + (uint64_t) (r - s0) * pb);
            }
        }
        for (int32_t i = 0; i < a->n_tok;) {
            const int nc = a->n_tok - i >= RM_MULTI_MAX ? RM_MULTI_MAX : a->n_tok - i >= 4 ? 4 : 1;
            for (int64_t r = s0; r < s1; r++) {
                float v[RM_MULTI_MAX];
                t->pk->dot(n_in, nc, v, room + (uint64_t) (r - s0) * pb, raw + (uint64_t) r * rb,
                           t->xt + (uint64_t) i * t->xt_stride, t->xt_stride, t->x_info + i * t->x_info_stride,
                           t->x_info_stride);
                for (int c = 0; c < nc; c++) {
                    store(a, i + c, r, v[c]);
                }
            }
            i += nc;
        }
    }
}

/* matmul_tile on rows stored packed at load: nothing to pack, the same results. */
static void matmul_tile_stored(const mm_task * t, int64_t r0, int64_t r1) {
    const rm_matmul_args * a = t->a;
    const int64_t n_in = a->w->ne[0];
    const uint64_t rb = a->w->row_bytes;
    if (t->pk->dot_tile) {   /* tiles of rows: all the tokens at once (a chunk's rows are whole tiles) */
        for (int32_t i = 0; i < a->n_tok; i += RM_MULTI_MAX) {
            const int nc = a->n_tok - i < RM_MULTI_MAX ? a->n_tok - i : RM_MULTI_MAX;
            rm_cpu_dot_stored(t->pk, n_in, nc, t->stored, rb, r0, r1, t->xt + (uint64_t) i * t->xt_stride, t->xt_stride,
                              NULL, 0, a->y + (int64_t) i * a->y_stride, a->y_stride, a->accumulate);
        }
        return;
    }
    for (int32_t i = 0; i < a->n_tok;) {
        const int nc = a->n_tok - i >= RM_MULTI_MAX ? RM_MULTI_MAX : a->n_tok - i >= 4 ? 4 : 1;
        for (int64_t r = r0; r < r1; r++) {
            float v[RM_MULTI_MAX];
            if (t->burst) rm_prefetch_row_ahead(t->stored + (uint64_t) r * rb, rb);
            t->pk->dot_stored(n_in, nc, v, t->stored + (uint64_t) r * rb, t->xt + (uint64_t) i * t->xt_stride,
                              t->xt_stride, t->x_info ? t->x_info + i * t->x_info_stride : NULL, t->x_info_stride);
            for (int c = 0; c < nc; c++) {
                store(a, i + c, r, v[c]);
            }
        }
        i += nc;
    }
}

/* y[i][r] (+)= dot(row r, token i) for the rows of one tile and every token, four tokens at a
 * time where the type has a multi-token kernel (each weight block is then unpacked once for four). */
static void matmul_tile(const mm_task * t, int ith, int64_t r0, int64_t r1) {
    const rm_matmul_args * a = t->a;
    const int64_t n_in = a->w->ne[0];
    const uint64_t rb = a->w->row_bytes;
    if (t->tk) {   /* the tile form: RM_TILE_ROWS rows at a time against every token */
        for (int64_t s0 = r0; s0 < r1; s0 += RM_TILE_ROWS) {
            t->tk->matmul(n_in, t->stored ? t->stored : t->wdata, t->stored != NULL, rb, s0,
                          s0 + RM_TILE_ROWS < r1 ? s0 + RM_TILE_ROWS : r1, t->xt, a->n_tok,
                          t->pack + (uint64_t) ith * t->pack_stride, a->y, a->y_stride, a->accumulate);
        }
        return;
    }
    if (t->stored && t->xt && a->n_tok < MM_PACK_MIN_TOKENS) {
        matmul_tile_stored(t, r0, r1);
        return;
    }
    if (t->xt) {
        matmul_tile_packed(t, ith, r0, r1);
        return;
    }
    if (t->vec_dot_multi) {
        for (int32_t i = 0; i < a->n_tok;) {
            /* eight, then four, then what is left in one call (a kernel may unpack once for it) */
            const int32_t left = a->n_tok - i;
            const int nc = left >= RM_MULTI_MAX ? RM_MULTI_MAX : left >= 4 ? 4 : (int) left;
            const uint8_t * x = t->xq + (uint64_t) i * t->xq_stride;
            const float * info = t->x_info ? t->x_info + i * t->x_info_stride : NULL;
            for (int64_t r = r0; r < r1; r++) {
                float v[RM_MULTI_MAX];
                if (t->burst) rm_prefetch_row_ahead(t->wdata + (uint64_t) r * rb, rb);
                t->vec_dot_multi(n_in, nc, v, t->wdata + (uint64_t) r * rb, x, t->xq_stride, info, t->x_info_stride);
                for (int c = 0; c < nc; c++) {
                    store(a, i + c, r, v[c]);
                }
            }
            i += nc;
        }
        return;
    }
    for (int32_t i = 0; i < a->n_tok; i++) {
        const uint8_t * x = t->xq + (uint64_t) i * t->xq_stride;
        for (int64_t r = r0; r < r1; r++) {
            float v;
            if (t->burst) rm_prefetch_row_ahead(t->wdata + (uint64_t) r * rb, rb);
            t->vec_dot(n_in, &v, t->wdata + (uint64_t) r * rb, x);
            store(a, i, r, v);
        }
    }
}

static void matmul_task(void * p, int ith, int nth) {
    mm_task * t = p;
    const int64_t n_rows = t->a->w->ne[1];
    int from = 0;
    for (;;) {
        const int64_t k = deal_next(t->deal, ith, &from);
        if (k < 0) {
            break;
        }
        const int64_t end = (k + 1) * t->chunk_rows < n_rows ? (k + 1) * t->chunk_rows : n_rows;
        for (int64_t r0 = k * t->chunk_rows; r0 < end; r0 += t->tile_rows) {
            matmul_tile(t, ith, r0, r0 + t->tile_rows < end ? r0 + t->tile_rows : end);
        }
    }
    (void) nth;
}

static int64_t clamp_rows(int64_t rows, int64_t lo, int64_t hi) {
    return rows < lo ? lo : rows > hi ? hi : rows;
}

/* Kernels, weights and row chunking of one product; the activations are set by the caller. */
static void mm_setup(const cpu_ctx * c, mm_task * t, const rm_matmul_args * a, const rm_weight * w, int chunks_min) {
    const rm_type_traits * tt = rm_type_traits_get(w->type);
    const int64_t n_rows = w->ne[1];
    memset(t, 0, sizeof(*t));
    t->a = a;
    t->vec_dot = rm_cpu_vec_dot(w->type);
    t->vec_dot_multi = rm_cpu_vec_dot_multi(w->type);
    t->quantize = rm_cpu_quantize(tt->vec_dot_type);
    t->wdata = rm_weight_matrix(w, a->mat);
    t->stored = c->repacked ? rm_dev_weights_find(c->repacked, t->wdata) : NULL;
    const int stream = a->n_tok < 4;
    t->burst = rm_cpu_row_burst_isa(rm_isa_active(), w->type, a->n_tok);
    const int64_t chunk_bytes = stream ? MM_STREAM_CHUNK_BYTES : MM_BATCH_CHUNK_BYTES;
    const int64_t per_chunk = (n_rows + chunks_min - 1) / chunks_min;
    t->chunk_rows = clamp_rows((int64_t) (chunk_bytes / (int64_t) w->row_bytes), 1, per_chunk > 0 ? per_chunk : 1);
    t->tile_rows = clamp_rows((int64_t) (MM_TILE_BYTES / w->row_bytes), 1, t->chunk_rows);
    t->n_chunks = (n_rows + t->chunk_rows - 1) / t->chunk_rows;
    atomic_init(&t->next_token, 0);
}

/* Bytes of one token's quantized activations for weights of type `type` (0: F32, used as is),
 * and floats of its Q8_0 block info (0: none). */
static uint64_t act_row_bytes(int32_t type, int64_t n_in) {
    const int32_t vt = rm_type_traits_get(type)->vec_dot_type;
    return vt == RM_TYPE_F32 ? 0 : rm_row_bytes(vt, n_in);
}

static int64_t act_info_floats(int32_t type, int64_t n_in) {
    const int32_t vt = rm_type_traits_get(type)->vec_dot_type;
    return rm_cpu_vec_dot_multi(type) && vt == RM_TYPE_Q8_0 ? 2 * (n_in / RM_QK) : 0;
}

/* Points t at its activations: the float rows themselves for F32 weights, else xq (and info). */
static void mm_set_acts(mm_task * t, uint8_t * xq, float * info) {
    const rm_matmul_args * a = t->a;
    const int32_t type = rm_type_traits_get(t->a->w->type)->vec_dot_type;
    if (type == RM_TYPE_F32) {
        t->xq = (const uint8_t *) a->x;
        t->xq_stride = (uint64_t) a->x_stride * sizeof(float);
        return;
    }
    t->xq = xq;
    t->xq_stride = act_row_bytes(a->w->type, a->w->ne[0]);
    t->x_info_stride = act_info_floats(a->w->type, a->w->ne[0]);
    t->x_info = t->x_info_stride ? info : NULL;
}

/* Whether t takes the packed form (rm_packed_form_runs): rows stored packed at load, read as they
 * are or unpacked, or enough tokens to pay for packing them. */
static int wants_packed(const mm_task * t) {
    const rm_packed_kernels * pk = rm_cpu_packed(t->a->w->type);
    const int acts = t->x_info || rm_type_traits_get(t->a->w->type)->vec_dot_type == RM_TYPE_Q8_K;   /* the forms' needs */
    return pk && acts && rm_packed_form_runs(pk, t->a->w->ne[0], t->a->n_tok, t->stored != NULL);
}

/* The tile form's kernels for t, when they give the one-token kernels' floats (a token's numbers
 * must not depend on its batch), its rows suit them and it has enough tokens (rm_cpu_tile_for); or,
 * with `like` (the tiles another product laid out the same activations for), the set's tiles of
 * like's layout for any number of tokens; NULL: none. */
static const rm_tile_kernels * tile_for(const mm_task * t, const rm_tile_kernels * like) {
    const int32_t type = t->a->w->type;
    const rm_tile_kernels * tk = rm_cpu_tile_for(type, t->a->n_tok);
    if (like) {
        tk = rm_cpu_tile(type);
        tk = tk && tk->put_group == like->put_group ? tk : rm_cpu_tile_below(type);
        tk = tk && tk->put_group == like->put_group ? tk : NULL;
    }
    return tk && tk->exact && t->xq && tk->usable(t->a->w->ne[0]) ? tk : NULL;
}

/* t in the tile form on activations laid out at xt: chunks of whole tiles of rows. */
static void mm_set_tile(mm_task * t, const cpu_ctx * c, const rm_tile_kernels * tk, uint8_t * xt) {
    const int64_t n_rows = t->a->w->ne[1];
    t->tk = tk;
    t->xt = xt;
    t->pack = c->pack;
    t->pack_stride = c->pack_stride;
    t->chunk_rows = (t->chunk_rows + RM_TILE_ROWS - 1) / RM_TILE_ROWS * RM_TILE_ROWS;
    t->tile_rows = t->chunk_rows;
    t->n_chunks = (n_rows + t->chunk_rows - 1) / t->chunk_rows;
}

static void mm_set_packed(mm_task * t, const cpu_ctx * c, uint8_t * xt) {
    t->pk = rm_cpu_packed(t->a->w->type);
    t->xt = xt;
    t->xt_stride = t->pk->act_bytes(t->a->w->ne[0]);
    t->pack = c->pack;
    t->pack_stride = c->pack_stride;
    if (!t->stored || t->a->n_tok >= MM_PACK_MIN_TOKENS) {   /* tiles packed per product */
        const int64_t rows = (int64_t) (MM_PACK_BYTES / t->pk->packed_bytes(t->a->w->ne[0]));
        t->tile_rows = clamp_rows(rows, 1, t->chunk_rows);
    } else if (t->pk->dot_tile) {   /* rows stored in tiles: chunks of whole ones */
        const int64_t n_rows = t->a->w->ne[1];
        t->chunk_rows = (t->chunk_rows + RM_TILE_ROWS - 1) / RM_TILE_ROWS * RM_TILE_ROWS;
        t->tile_rows = t->chunk_rows;
        t->n_chunks = (n_rows + t->chunk_rows - 1) / t->chunk_rows;
    }
}

static void cpu_matmul(rm_backend * be, const rm_matmul_args * a) {
    cpu_ctx * c = be->ctx;
    const int chunks_min = (a->n_tok < 4 ? MM_STREAM_CHUNKS_PER_THREAD : MM_BATCH_CHUNKS_PER_THREAD) * rm_pool_size(c->pool);
    mm_task t;
    mm_setup(c, &t, a, a->w, chunks_min);
    mm_set_acts(&t, c->xq, c->x_info);
    if (t.xq == c->xq) {
        RM_ASSERT(t.xq_stride * (uint64_t) a->n_tok <= c->xq_cap);
        RM_ASSERT(t.x_info_stride * a->n_tok <= c->x_info_cap);
        const rm_tile_kernels * tk = tile_for(&t, NULL);
        if (tk && tk->act_bytes(a->w->ne[0], a->n_tok) <= c->xt_cap) {
            mm_set_tile(&t, c, tk, c->xt);
        } else if (wants_packed(&t) && rm_cpu_packed(a->w->type)->act_bytes(a->w->ne[0]) * (uint64_t) a->n_tok <= c->xt_cap) {
            mm_set_packed(&t, c, c->xt);
        }
        if (a->n_tok == 1) {
            quantize_unit(&t, 0);   /* a microsecond: not worth waking the pool */
        } else {
            rm_pool_run_shared(c->pool, quantize_task, &t);
        }
    }
    mm_deal deal;
    deal_init(&deal, t.n_chunks, a->n_tok < 4 ? rm_pool_size(c->pool) : 1);
    t.deal = &deal;
    rm_pool_run_shared(c->pool, matmul_task, &t);
}

/* ---- several products in one dispatch (matmul_many) ----------------------------------------- */

/* Items of one call. Each has a base product and optionally a residual one over its first rows;
 * activations quantized for one are reused by every other with the same rows and type (gate and
 * up of an expert; in decode, every expert of the token). Rows of all items are chunked into one
 * list that the pool's threads take from a shared counter, so one wake-up serves them all. */
#define MM_MANY_MAX 64

typedef struct many_task {
    mm_task        t[2 * MM_MANY_MAX];        /* item i: t[2i] its base, t[2i+1] its residual (a NULL: none) */
    rm_matmul_args res_args[MM_MANY_MAX];
    int64_t        first_chunk[MM_MANY_MAX + 1];
    int32_t        n;
    mm_task *      quant[2 * MM_MANY_MAX];     /* the tasks that own a quantized copy of their rows */
    int64_t        first_row[2 * MM_MANY_MAX + 1];
    int32_t        n_quant;
    mm_deal        deal;
    atomic_llong   next_row;
} many_task;

static void many_quantize_fn(void * p, int ith, int nth) {
    many_task * m = p;
    int32_t q = 0;
    for (;;) {
        const int64_t k = atomic_fetch_add_explicit(&m->next_row, 1, memory_order_relaxed);
        if (k >= m->first_row[m->n_quant]) {
            break;
        }
        while (k >= m->first_row[q + 1]) {
            q++;
        }
        quantize_unit(m->quant[q], k - m->first_row[q]);
    }
    (void) ith;
    (void) nth;
}

static void many_matmul_fn(void * p, int ith, int nth) {
    many_task * m = p;
    int32_t i = 0;
    int from = 0;
    for (;;) {
        const int64_t k = deal_next(&m->deal, ith, &from);
        if (k < 0) {
            break;
        }
        if (k < m->first_chunk[i]) {   /* a thread's chunks increase within a share */
            i = 0;
        }
        while (k >= m->first_chunk[i + 1]) {
            i++;
        }
        const mm_task * t = &m->t[2 * i], * r = &m->t[2 * i + 1];
        const int64_t n_rows = t->a->w->ne[1], kk = k - m->first_chunk[i];
        const int64_t end = (kk + 1) * t->chunk_rows < n_rows ? (kk + 1) * t->chunk_rows : n_rows;
        for (int64_t r0 = kk * t->chunk_rows; r0 < end; r0 += t->tile_rows) {
            const int64_t r1 = r0 + t->tile_rows < end ? r0 + t->tile_rows : end;
            matmul_tile(t, ith, r0, r1);
            if (r->a) {
                matmul_tile(r, ith, r0, r1);   /* the residual rows while the outputs are in cache */
            }
        }
    }
    (void) nth;
}

/* Points t at activations already quantized for the same rows (and transposed, for the prefill
 * form), or takes room for them and makes t their owner; 0 when the scratch is full. */
typedef struct many_room {
    uint64_t xq, xt;
    int64_t  info;
} many_room;

static int acts_for(cpu_ctx * c, many_task * m, mm_task * t, many_room * used) {
    const rm_matmul_args * a = t->a;
    const int32_t vt = rm_type_traits_get(a->w->type)->vec_dot_type;
    if (vt == RM_TYPE_F32) {
        mm_set_acts(t, NULL, NULL);
        return 1;
    }
    for (int32_t q = 0; q < m->n_quant; q++) {
        const mm_task * o = m->quant[q];
        if (o->a->x == a->x && o->a->x_stride == a->x_stride && o->a->n_tok >= a->n_tok && o->a->w->ne[0] == a->w->ne[0] &&
            rm_type_traits_get(o->a->w->type)->vec_dot_type == vt && (o->x_info != NULL) == (act_info_floats(a->w->type, a->w->ne[0]) > 0)) {
            mm_set_acts(t, (uint8_t *) o->xq, (float *) o->x_info);
            const rm_tile_kernels * tk = o->tk ? tile_for(t, o->tk) : NULL;
            if (tk) {   /* the same layout */
                mm_set_tile(t, c, tk, o->xt);
                return 1;
            }
            if (o->xt && !o->tk && wants_packed(t) && rm_cpu_packed(a->w->type)->transpose_act == o->pk->transpose_act) {
                mm_set_packed(t, c, o->xt);
                return 1;
            }
            if (!t->stored) {   /* the plain quantized rows serve it */
                return 1;
            }
            /* rows kept in the stored layout need their own transposed copy (nothing else reads
             * them): quantized again below */
            mm_set_acts(t, NULL, NULL);
        }
    }
    const uint64_t bytes = act_row_bytes(a->w->type, a->w->ne[0]) * (uint64_t) a->n_tok;
    const int64_t floats = act_info_floats(a->w->type, a->w->ne[0]) * a->n_tok;
    if (used->xq + bytes > c->xq_many_cap || used->info + floats > c->x_info_many_cap) {
        return 0;
    }
    mm_set_acts(t, c->xq_many + used->xq, c->x_info_many + used->info);
    used->xq += (bytes + 63) / 64 * 64;
    used->info += floats;
    const rm_tile_kernels * tk = tile_for(t, NULL);
    if (tk && used->xt + tk->act_bytes(a->w->ne[0], a->n_tok) <= c->xt_many_cap) {
        mm_set_tile(t, c, tk, c->xt_many + used->xt);
        used->xt += (tk->act_bytes(a->w->ne[0], a->n_tok) + 63) / 64 * 64;
    } else if (wants_packed(t)) {
        const uint64_t tb = rm_cpu_packed(a->w->type)->act_bytes(a->w->ne[0]) * (uint64_t) a->n_tok;
        if (used->xt + tb <= c->xt_many_cap) {
            mm_set_packed(t, c, c->xt_many + used->xt);
            used->xt += (tb + 63) / 64 * 64;
        }
    }
    m->quant[m->n_quant] = t;
    m->first_row[m->n_quant + 1] = m->first_row[m->n_quant] + quant_units(t);
    m->n_quant++;
    return 1;
}

static void cpu_matmul_many(rm_backend * be, const rm_mm_item * items, int32_t n) {
    cpu_ctx * c = be->ctx;
    if (n > MM_MANY_MAX) {
        cpu_matmul_many(be, items, MM_MANY_MAX);
        cpu_matmul_many(be, items + MM_MANY_MAX, n - MM_MANY_MAX);
        return;
    }
    many_task * m = c->many;
    m->n = n;
    m->n_quant = 0;
    m->first_chunk[0] = 0;
    m->first_row[0] = 0;
    many_room used = {0, 0, 0};
    int fits = 1;
    for (int32_t i = 0; i < n && fits; i++) {
        const rm_mm_item * it = &items[i];
        mm_task * t = &m->t[2 * i], * r = &m->t[2 * i + 1];
        mm_setup(c, t, &it->a, it->a.w, 1);
        memset(r, 0, sizeof(*r));
        if (it->res && it->n_res > 0) {
            m->res_args[i] = it->a;
            m->res_args[i].w = it->res;
            m->res_args[i].n_tok = it->n_res;
            m->res_args[i].accumulate = 1;
            mm_setup(c, r, &m->res_args[i], it->res, 1);
            r->chunk_rows = t->chunk_rows;
            r->tile_rows = t->tile_rows;
        }
        fits = acts_for(c, m, t, &used) && (!r->a || acts_for(c, m, r, &used));
        m->first_chunk[i + 1] = m->first_chunk[i] + t->n_chunks;
    }
    if (!fits) {   /* more activations than the scratch holds: one product at a time */
        for (int32_t i = 0; i < n; i++) {
            cpu_matmul(be, &items[i].a);
            if (items[i].res && items[i].n_res > 0) {
                rm_matmul_args r = items[i].a;
                r.w = items[i].res;
                r.n_tok = items[i].n_res;
                r.accumulate = 1;
                cpu_matmul(be, &r);
            }
        }
        return;
    }
    int stream = 1;
    for (int32_t i = 0; i < n; i++) {
        stream &= items[i].a.n_tok < 4;
    }
    deal_init(&m->deal, m->first_chunk[n], stream ? rm_pool_size(c->pool) : 1);
    atomic_init(&m->next_row, 0);
    int64_t n_quant_tok = 0;
    for (int32_t q = 0; q < m->n_quant; q++) {
        n_quant_tok += m->quant[q]->a->n_tok;
    }
    if (n_quant_tok <= 2) {   /* a microsecond: not worth waking the pool */
        for (int32_t q = 0; q < m->n_quant; q++) {
            for (int64_t u = 0; u < quant_units(m->quant[q]); u++) {
                quantize_unit(m->quant[q], u);
            }
        }
    } else {
        rm_pool_run_shared(c->pool, many_quantize_fn, m);
    }
    rm_pool_run_shared(c->pool, many_matmul_fn, m);
}

/* Attention goes in tiles of positions, flash attention's order: a job is a block of rows that
 * share one kv head (a few tokens times a group of its query heads), and each tile of ATTN_TILE
 * positions of K and V is read from memory once for all of them and passed over by each row
 * while it is in cache. Each row keeps its running max and sum (the online softmax) and its
 * output is rescaled when the max grows, so the scores of a whole context are never held. Reading
 * the cache once per query row instead (as one job per token and head does) made a 16-token
 * prompt chunk at context 1,900 spend most of its step streaming the same keys 128 times.
 * Within a tile the rows go three at a time through the sets' multi-row kernels (each key and
 * value loaded into a register once for the three), each group over the whole tile at once: its
 * sums stay in registers for it (in chunks of 16 positions, each group loaded and stored its
 * output's sums four times a tile), and the tile, 32 KiB of keys and as much of values, is read
 * from L2 (8,192 tokens as below: 266 -> 285 tok/s).
 *
 * A job holds up to ATTN_ROWS rows (16 tokens of 8 query heads): every job converts and reads the
 * kv head's whole context once, so more rows a job is less of the cache's traffic; a prefill of
 * 8,192 tokens in steps of 512 (4 kv heads of 8 query heads, F16 cache, AVX-512) ran at 237 tok/s
 * with 32 rows (the F16 conversion of the tiles, waiting on L3, took 15% of it) and 266 with 128;
 * 256 and 512 were not faster.
 *
 * The positions go in segments of ATTN_SEG, at its multiples: a row's softmax and output sums are
 * taken over one segment at a time from nothing, and the segments' are merged in order
 * (attn_merge), a sink's logit last (attn_finish). So a job may take one segment of a long context
 * and leave the merge to the end: one token's attention at depth is split between the threads by
 * positions, and each of its jobs reads whole rows of the cache, every kv head at once, where a job
 * of one kv head reads a 256-byte slice of every 1 KiB row (F16, 4 kv heads of 128), a stride the
 * prefetchers serve poorly. A row's floats are the same either way: the same segments, merged in
 * the same order by the same code. Decode after 16,384 positions (the benchmark model, F16 cache,
 * AVX-512, 2 threads, medians of 3 runs of 48 tokens each): 31.8 ms a token with a job per kv
 * head, 26.0 with its slices prefetched (kv_tile_floats), 20.7 split by segments. */
#define ATTN_TILE RM_ATTN_TILE   /* positions: 64 rows of K and of V, 32 KiB each at head_dim 128 */
#define ATTN_ROWS 128          /* query rows of a job at most */
#define ATTN_JOBS_PER_THREAD 4
/* The groups' positions go to the end of the chunk of ATTN_CHUNK holding their furthest reach (a
 * multiple of 8, the kernels' groups of positions: a score's floats stay the same); past it, their
 * weights are 0 and nothing is computed. */
#define ATTN_CHUNK 16
#define ATTN_SEG 512           /* positions of a segment: a multiple of ATTN_TILE */
#define ATTN_WIDE 1024         /* floats of a tile's row at most where a job takes several kv heads */
#define KV_AHEAD 32            /* rows of the cache a tile's conversion prefetches ahead of its reads */

#if defined(__GNUC__)
#define ATTN_NOINLINE __attribute__((noinline))
#else
#define ATTN_NOINLINE
#endif

/* How a cache of another type than F32 is read: its conversion to floats and its row's layout. */
typedef struct kv_reader {
    rm_to_float_fn to_float;
    uint64_t       row_bytes, block_bytes;
    int64_t        block_elems;
} kv_reader;

typedef struct attn_task {
    const rm_attn_args * a;
    kv_reader            rk, rv;      /* with a->type_k / type_v other than F32 */
    cpu_ctx *            c;
    rm_attn_scores_rows_fn scores_rows;
    rm_attn_values_rows_fn values_rows;
    rm_exp_sum_fn        exp_sum;
    rm_max_fn            max_of;
    /* by kv head: a job is tb tokens times gs query heads of one kv head, over every segment */
    int32_t              tb, gs;
    int32_t              n_tb, n_gs;  /* token blocks; head groups per kv head */
    /* split: a job is one segment times kh kv heads (all their query heads), every token */
    int32_t              split;
    int32_t              seg0, n_seg; /* the segments [seg0, seg0 + n_seg) */
    int32_t              kh, n_kc;    /* kv heads a job; jobs a segment */
    int32_t              tw;          /* floats of a tile's row */
    float *              scratch;     /* per thread thread_floats: its tile of K and of V, a segment's sums */
    int64_t              thread_floats;
    float *              parts;       /* split: per segment and row (token * n_head + head), DV sums, max, sum */
    atomic_llong         next_job, next_row;   /* the jobs' counter; the split's merge's */
} attn_task;

/* The kv heads one tile holds at most: as many as ATTN_WIDE floats a row take, at least one. */
static inline int32_t attn_kh_cap(int32_t wide, int32_t n_head_kv) {
    const int32_t cap = ATTN_WIDE / wide > 1 ? ATTN_WIDE / wide : 1;
    return n_head_kv < cap ? n_head_kv : cap;
}

/* A thread's scratch: a tile of K and of V (ATTN_TILE rows of tw floats), a segment's output sums
 * for ATTN_ROWS rows of up to `wide` floats; on cache lines of their own. */
static inline int64_t attn_thread_floats(int64_t tw, int64_t wide) {
    return (2 * ATTN_TILE * tw + ATTN_ROWS * wide + 15) / 16 * 16;
}

int64_t rm_cpu_attn_scratch_floats(int32_t n_threads, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                   int32_t n_ctx) {
    /* a call's tile row is kh * its width <= ATTN_WIDE, or one head of at most head_dim */
    const int64_t all = (int64_t) n_head_kv * head_dim, tw = all < ATTN_WIDE ? all : ATTN_WIDE;
    const int64_t rows = n_head < ATTN_ROWS ? n_head : ATTN_ROWS;   /* a split's: one token's heads */
    return attn_thread_floats(tw > head_dim ? tw : head_dim, head_dim) * (n_threads > 0 ? n_threads : 1) +
           ((int64_t) n_ctx / ATTN_SEG + 2) * rows * (head_dim + 2);
}

/* The positions token i sees: [*p0, returned). */
static inline int32_t attn_span(const rm_attn_args * a, int32_t i, int32_t * p0) {
    const int32_t n_all = a->pos0 + i + 1;
    *p0 = a->window > 0 && n_all > a->window ? n_all - a->window : 0;   /* sliding window */
    return n_all;
}

static kv_reader kv_reader_of(int32_t type, int64_t row_elems) {
    const rm_type_traits * tt = rm_type_traits_get(type);
    return (kv_reader){rm_cpu_dequantize(type), (uint64_t) (row_elems / tt->block_elems) * (uint64_t) tt->block_bytes,
                       (uint64_t) tt->block_bytes, tt->block_elems};
}

/* Rows row..row + n of a slice of a cache read by r (D elements from element `head` of each row:
 * one kv head's or several adjacent ones'), as floats in out (n rows of D) (a block type's blocks
 * never straddle two heads: sizes.c's rm_kv_types_ok). A slice narrower than the row is fetched
 * KV_AHEAD rows ahead meanwhile: such a stride the hardware prefetchers follow poorly (whole rows
 * they do, and fetching those too was slower); past the cache's end a prefetch only misses. */
static void kv_tile_floats(const void * cache, const kv_reader * r, int64_t row, int32_t n, int64_t head, int32_t D,
                           float * out) {
    const uint8_t * at = (const uint8_t *) cache + (uint64_t) row * r->row_bytes +
                         (uint64_t) (head / r->block_elems) * r->block_bytes;
    const uint64_t slice = (uint64_t) (D / r->block_elems) * r->block_bytes;
    const uint64_t fetch = slice < r->row_bytes ? slice : 0;   /* whole rows stream well as they are */
    for (int32_t j = 0; j < n; j++) {
        const uint8_t * ahead = at + (uint64_t) (j + KV_AHEAD) * r->row_bytes;
        for (uint64_t b = 0; b < fetch; b += 64) {
            __builtin_prefetch(ahead + b, 0, 0);
        }
        r->to_float(at + (uint64_t) j * r->row_bytes, out + (int64_t) j * D, D);
    }
}

/* The furthest reach of nr rows (within the tile). */
static inline int32_t attn_rows_reach(const int32_t * reach, int nr) {
    int32_t m = 0;
    for (int i = 0; i < nr; i++) m = reach[i] > m ? reach[i] : m;
    return m;
}

/* The values' head width. */
static inline int32_t attn_dv(const rm_attn_args * a) { return a->head_dim_v > 0 ? a->head_dim_v : a->head_dim; }

/* Merges a segment's softmax (its max m2, sum l2 and output sums o2) into a row's (*m, *l, o), both
 * rescaled to the larger max. Out of line: the split's final merge and the whole-context jobs run
 * this same code, so their floats agree. */
static ATTN_NOINLINE void attn_merge(float * o, float * m, float * l, const float * o2, float m2, float l2, int32_t n) {
    const float mx = *m > m2 ? *m : m2;
    const float f = expf(*m - mx), f2 = expf(m2 - mx);
    for (int32_t c = 0; c < n; c++) {
        o[c] = o[c] * f + o2[c] * f2;
    }
    *l = *l * f + l2 * f2;
    *m = mx;
}

/* A row's end: a sink's logit joins its softmax (a share of the weight, no value), and the output
 * sums are divided by the softmax's sum. */
static ATTN_NOINLINE void attn_finish(float * o, float m, float l, const float * sink, int32_t n) {
    if (sink) {
        const float mx = m > *sink ? m : *sink;
        const float f = expf(m - mx);
        l = l * f + expf(*sink - mx);
        for (int32_t c = 0; c < n; c++) o[c] *= f;
    }
    const float inv = 1.0f / l;
    for (int32_t c = 0; c < n; c++) o[c] *= inv;
}

/* A segment's sums of split row `row` (token * n_head + head): DV floats, then its max and sum. */
static inline float * attn_part(const attn_task * t, int32_t seg, int64_t row) {
    const int64_t DV = attn_dv(t->a), rows = (int64_t) t->a->n_tok * t->a->n_head;
    return t->parts + ((int64_t) (seg - t->seg0) * rows + row) * (DV + 2);
}

static void attn_job(const attn_task * t, int64_t job, float * sc, float * tile, float * seg_out) {
    const rm_attn_args * a = t->a;
    const int32_t D = a->head_dim, DV = attn_dv(a), G = a->n_head / a->n_head_kv;
    const int64_t q_stride = (int64_t) a->n_head * D, o_stride = (int64_t) a->n_head * DV;
    /* the tiles are read in place from an F32 cache, else converted into `tile` first */
    const int typed = a->type_k != RM_TYPE_F32 || (!a->v_in_k && a->type_v != RM_TYPE_F32);
    const float scale = a->scale > 0.0f ? a->scale : 1.0f / sqrtf((float) D);
    int32_t i0, n_i, kh0, n_kh, hg, n_h, s_lo, s_hi;   /* tokens, kv heads, query heads of each, segments */
    if (t->split) {
        const int32_t kc = (int32_t) (job % t->n_kc);
        i0 = 0;
        n_i = a->n_tok;
        kh0 = kc * t->kh;
        n_kh = a->n_head_kv - kh0 < t->kh ? a->n_head_kv - kh0 : t->kh;
        hg = 0;
        n_h = G;
        s_lo = s_hi = t->seg0 + (int32_t) (job / t->n_kc);
    } else {
        const int32_t g = (int32_t) (job % t->n_gs);
        kh0 = (int32_t) (job / t->n_gs % a->n_head_kv);
        n_kh = 1;
        i0 = (int32_t) (job / t->n_gs / a->n_head_kv) * t->tb;
        n_i = a->n_tok - i0 < t->tb ? a->n_tok - i0 : t->tb;
        hg = g * t->gs;
        n_h = G - hg < t->gs ? G - hg : t->gs;
        s_lo = 0;
        s_hi = INT32_MAX;
    }
    /* row r: kv head kh0 + r / per, token i0 + r % per / n_h, query head (kh0 + r / per) * G + hg + r % n_h */
    const int32_t per = n_i * n_h, R = n_kh * per;
    int32_t lo, lo_last;              /* the job's positions: the first token's first to the last's last */
    (void) attn_span(a, i0, &lo);
    const int32_t hi = attn_span(a, i0 + n_i - 1, &lo_last);
    s_lo = lo / ATTN_SEG > s_lo ? lo / ATTN_SEG : s_lo;
    s_hi = (hi - 1) / ATTN_SEG < s_hi ? (hi - 1) / ATTN_SEG : s_hi;
    /* a tile row's floats: the job's kv heads' converted, or the F32 cache's whole row in place */
    const int64_t k_stride = typed ? (int64_t) n_kh * D : (int64_t) a->n_head_kv * D;
    const int64_t v_stride = a->v_in_k ? k_stride : typed ? (int64_t) n_kh * DV : (int64_t) a->n_head_kv * DV;
    float * const vtile = tile + (int64_t) ATTN_TILE * t->tw;
    float M[ATTN_ROWS], L[ATTN_ROWS], m[ATTN_ROWS], l[ATTN_ROWS];
    uint8_t seen[ATTN_ROWS], fresh[ATTN_ROWS];   /* a segment in the row's sums; none of this segment's tiles yet */
    int32_t tok[ATTN_ROWS], head[ATTN_ROWS];     /* the row's token and query head */
    float * orow[ATTN_ROWS], * dst[ATTN_ROWS];   /* the row's output; where this segment's sums go */
    const float * qrow[ATTN_ROWS];
    for (int32_t r = 0; r < R; r++) {
        tok[r] = i0 + r % per / n_h;
        head[r] = (kh0 + r / per) * G + hg + r % n_h;
        qrow[r] = a->q + (int64_t) tok[r] * q_stride + (int64_t) head[r] * D;
        orow[r] = a->out + (int64_t) tok[r] * o_stride + (int64_t) head[r] * DV;
        seen[r] = 0;
    }
    for (int32_t sg = s_lo; sg <= s_hi; sg++) {
        const int32_t sp0 = sg * ATTN_SEG > lo ? sg * ATTN_SEG : lo;
        const int32_t sp1 = (sg + 1) * ATTN_SEG < hi ? (sg + 1) * ATTN_SEG : hi;
        for (int32_t r = 0; r < R; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            fresh[r] = 1;
            if (t->split) {
                dst[r] = attn_part(t, sg, (int64_t) tok[r] * a->n_head + head[r]);
            } else {
                dst[r] = seen[r] ? seg_out + (int64_t) r * DV : orow[r];
            }
        }
        for (int32_t p = sp0; p < sp1;) {
            /* tiles end at multiples of ATTN_TILE (and where a ring wraps): a row's arithmetic is
             * the same whichever rows share its job, so decode and prefill give the same floats */
            int32_t pe = (p / ATTN_TILE + 1) * ATTN_TILE < sp1 ? (p / ATTN_TILE + 1) * ATTN_TILE : sp1;
            int64_t row = p;          /* the tile's first cache row */
            if (a->ring > 0) {
                row = p % a->ring;
                if (pe - p > a->ring - row) pe = p + (int32_t) (a->ring - row);
            }
            const int32_t n = pe - p;
            if (typed) {               /* the job's kv heads' tile, once for all their rows */
                kv_tile_floats(a->k_cache, &t->rk, row, n, (int64_t) kh0 * D, n_kh * D, tile);
                if (!a->v_in_k) {
                    kv_tile_floats(a->v_cache, &t->rv, row, n, (int64_t) kh0 * DV, n_kh * DV, vtile);
                }
            }
            for (int32_t kl = 0; kl < n_kh; kl++) {
                const float * kt = typed ? tile + (int64_t) kl * D : a->k_cache + row * k_stride + (int64_t) (kh0 + kl) * D;
                const float * vt = a->v_in_k ? kt
                                   : typed ? vtile + (int64_t) kl * DV
                                           : a->v_cache + row * v_stride + (int64_t) (kh0 + kl) * DV;
                /* the rows that see positions of the tile: each scores the whole tile, the positions
                 * it does not see masked out (their exponentials are 0, and adding 0 changes no sum:
                 * a row's floats do not depend on how far the tile reaches for the other rows) */
                int32_t act[ATTN_ROWS], from[ATTN_ROWS], reach[ATTN_ROWS], na = 0;   /* sees [from, reach) */
                const float * qa[ATTN_ROWS];
                float * oa[ATTN_ROWS];
                for (int32_t r = kl * per; r < (kl + 1) * per; r++) {
                    int32_t r0;
                    const int32_t r1 = attn_span(a, tok[r], &r0);
                    const int32_t b = r0 > p ? r0 : p, e = r1 < pe ? r1 : pe;
                    if (b >= e) continue;
                    qa[na] = qrow[r];
                    oa[na] = dst[r];
                    from[na] = b - p;
                    reach[na] = e - p;
                    act[na++] = r;
                }
                for (int32_t k0 = 0; k0 < na; k0 += RM_ATTN_ROWS_AT_ONCE) {   /* a group of rows over the tile */
                    const int nr = na - k0 < RM_ATTN_ROWS_AT_ONCE ? (int) (na - k0) : RM_ATTN_ROWS_AT_ONCE;
                    const int32_t upto = (attn_rows_reach(reach + k0, nr) + ATTN_CHUNK - 1) / ATTN_CHUNK * ATTN_CHUNK;
                    t->scores_rows(D, upto < n ? upto : n, nr, qa + k0, kt, k_stride, scale, sc + (int64_t) k0 * ATTN_TILE,
                                   ATTN_TILE);
                }
                for (int32_t k = 0; k < na; k++) {
                    const int32_t r = act[k];
                    float * srow = sc + (int64_t) k * ATTN_TILE;
                    for (int32_t j = 0; j < from[k]; j++) srow[j] = -INFINITY;
                    for (int32_t j = reach[k]; j < n; j++) srow[j] = -INFINITY;
                    const float mx = t->max_of(srow + from[k], reach[k] - from[k], m[r]);
                    float * out = oa[k];
                    if (fresh[r]) {
                        memset(out, 0, sizeof(float) * (size_t) DV);
                    }
                    if (mx > m[r]) {      /* the earlier positions' weights shrink by e^(m - mx) */
                        const float f = expf(m[r] - mx);
                        l[r] *= f;
                        for (int32_t c = 0; !fresh[r] && c < DV; c++) out[c] *= f;
                        m[r] = mx;
                    }
                    l[r] += t->exp_sum(srow, n, mx);
                    fresh[r] = 0;
                }
                /* and the values, a group of rows over the tile at once (their sums stay in
                 * registers; the tile is read from L2 by each group): the chunks of positions
                 * before the rows' furthest reach, as the scores took them (weights 0 past each
                 * row's own) */
                for (int32_t k0 = 0; k0 < na; k0 += RM_ATTN_ROWS_AT_ONCE) {
                    const int nr = na - k0 < RM_ATTN_ROWS_AT_ONCE ? (int) (na - k0) : RM_ATTN_ROWS_AT_ONCE;
                    const int32_t upto = (attn_rows_reach(reach + k0, nr) + ATTN_CHUNK - 1) / ATTN_CHUNK * ATTN_CHUNK;
                    t->values_rows(DV, upto < n ? upto : n, nr, sc + (int64_t) k0 * ATTN_TILE, ATTN_TILE, vt, v_stride,
                                   oa + k0);
                }
            }
            p = pe;
        }
        /* the segment's softmax into the rows' own, or left for the split's merge */
        for (int32_t r = 0; r < R; r++) {
            if (t->split) {
                dst[r][DV] = fresh[r] ? -INFINITY : m[r];   /* -inf: the row sees none of the segment */
                dst[r][DV + 1] = l[r];
            } else if (fresh[r]) {
                continue;
            } else if (!seen[r]) {    /* the first: its sums went straight to the output */
                M[r] = m[r];
                L[r] = l[r];
                seen[r] = 1;
            } else {
                attn_merge(orow[r], &M[r], &L[r], dst[r], m[r], l[r], DV);
            }
        }
    }
    if (!t->split) {
        for (int32_t r = 0; r < R; r++) {   /* every row sees at least its own position */
            attn_finish(orow[r], M[r], L[r], a->sinks ? (const float *) a->sinks->data + head[r] : NULL, DV);
        }
    }
}

static void attn_task_fn(void * p, int ith, int nth) {
    attn_task * t = p;
    float * sc = t->c->scores + (int64_t) ith * t->c->scores_room;
    float * tile = t->scratch + (int64_t) ith * t->thread_floats;
    float * seg_out = tile + 2 * (int64_t) ATTN_TILE * t->tw;
    const int64_t n_jobs = t->split ? (int64_t) t->n_seg * t->n_kc : (int64_t) t->n_tb * t->a->n_head_kv * t->n_gs;
    for (;;) {
        const int64_t job = atomic_fetch_add_explicit(&t->next_job, 1, memory_order_relaxed);
        if (job >= n_jobs) break;
        attn_job(t, job, sc, tile, seg_out);
    }
    (void) nth;
}

/* The split's end: each row's segments merged in order, the first taken as it is (as a job over
 * every segment leaves it in the output). */
static void attn_merge_fn(void * p, int ith, int nth) {
    attn_task * t = p;
    const rm_attn_args * a = t->a;
    const int32_t DV = attn_dv(a);
    const int64_t rows = (int64_t) a->n_tok * a->n_head;
    for (;;) {
        const int64_t row = atomic_fetch_add_explicit(&t->next_row, 1, memory_order_relaxed);
        if (row >= rows) break;
        const int32_t i = (int32_t) (row / a->n_head), h = (int32_t) (row % a->n_head);
        float * o = a->out + (int64_t) i * a->n_head * DV + (int64_t) h * DV;
        float M = -INFINITY, L = 0.0f;
        int seen = 0;
        for (int32_t sg = t->seg0; sg < t->seg0 + t->n_seg; sg++) {
            const float * part = attn_part(t, sg, row);
            if (part[DV] == -INFINITY) continue;
            if (!seen) {
                memcpy(o, part, sizeof(float) * (size_t) DV);
                M = part[DV];
                L = part[DV + 1];
                seen = 1;
            } else {
                attn_merge(o, &M, &L, part, part[DV], part[DV + 1], DV);
            }
        }
        attn_finish(o, M, L, a->sinks ? (const float *) a->sinks->data + h : NULL, DV);
    }
    (void) ith, (void) nth;
}

/* Rows per job: all of a kv head's query heads and as many tokens as leave the threads
 * ATTN_JOBS_PER_THREAD jobs each. A kv head's query heads split only where there are fewer kv
 * heads (times tokens) than threads: each group reads the kv head's keys and values again, which
 * at depth costs more than uneven jobs do (decode after 4,096 positions, 4 kv heads, 2 threads:
 * 14.6 ms per token split in two groups, 12.5 whole). */
static void attn_blocks(attn_task * t, int nth) {
    const rm_attn_args * a = t->a;
    const int32_t G = a->n_head / a->n_head_kv, want = ATTN_JOBS_PER_THREAD * nth;
    const int64_t units = (int64_t) a->n_tok * a->n_head_kv;   /* a token's heads of one kv head */
    int32_t gs = G < ATTN_ROWS ? G : ATTN_ROWS;
    int32_t n_gs = (G + gs - 1) / gs;
    if (units * n_gs < nth) {
        const int64_t split = (want + units - 1) / units;
        const int32_t fewer = (int32_t) ((G + split - 1) / split);
        gs = fewer < gs ? fewer : gs;   /* never above ATTN_ROWS, the rows a job keeps state for */
        n_gs = (G + gs - 1) / gs;
    }
    int64_t tb = units * n_gs / want;
    tb = tb < 1 ? 1 : tb > ATTN_ROWS / gs ? ATTN_ROWS / gs : tb;
    tb = tb > a->n_tok ? a->n_tok : tb;
    t->gs = gs;
    t->n_gs = n_gs;
    t->tb = (int32_t) tb;
    t->n_tb = (int32_t) ((a->n_tok + tb - 1) / tb);
}

/* The split by segments, where a call's rows are few (a token's heads) and its context spans two
 * segments or more: as many kv heads a job as a tile holds (whole rows of the cache where it holds
 * them all), fewer where the segments alone would leave the threads short of jobs. */
static int attn_split(attn_task * t, int nth, int32_t wide) {
    const rm_attn_args * a = t->a;
    const int32_t G = a->n_head / a->n_head_kv, want = ATTN_JOBS_PER_THREAD * nth;
    int32_t lo;
    (void) attn_span(a, 0, &lo);
    t->seg0 = lo / ATTN_SEG;
    t->n_seg = (a->pos0 + a->n_tok - 1) / ATTN_SEG - t->seg0 + 1;
    if (t->n_seg < 2 || (int64_t) a->n_tok * a->n_head > ATTN_ROWS) return 0;
    int32_t kh = attn_kh_cap(wide, a->n_head_kv);
    kh = kh < ATTN_ROWS / (a->n_tok * G) ? kh : ATTN_ROWS / (a->n_tok * G);
    const int32_t kc_want = (want + t->n_seg - 1) / t->n_seg;
    const int32_t kh_fewer = (a->n_head_kv + kc_want - 1) / kc_want;
    kh = kh_fewer < kh ? kh_fewer : kh;
    t->kh = kh < 1 ? 1 : kh;
    t->n_kc = (a->n_head_kv + t->kh - 1) / t->kh;
    return 1;
}

static void cpu_attention(rm_backend * be, const rm_attn_args * a) {
    cpu_ctx * c = be->ctx;
    const int nth = rm_pool_size(c->pool);
    attn_task t = {.a = a, .c = c, .scores_rows = rm_cpu_attn_scores_rows(), .values_rows = rm_cpu_attn_values_rows(),
                   .exp_sum = rm_cpu_exp_sum(), .max_of = rm_cpu_max()};
    const int32_t DV = attn_dv(a), wide = a->head_dim > DV ? a->head_dim : DV;
    if (a->type_k != RM_TYPE_F32 || (!a->v_in_k && a->type_v != RM_TYPE_F32)) {
        t.rk = kv_reader_of(a->type_k, (int64_t) a->n_head_kv * a->head_dim);
        t.rv = a->v_in_k ? t.rk : kv_reader_of(a->type_v, (int64_t) a->n_head_kv * DV);
    }
    t.tw = attn_kh_cap(wide, a->n_head_kv) * wide;
    t.thread_floats = attn_thread_floats(t.tw, wide);
    attn_blocks(&t, nth);
    t.split = attn_split(&t, nth, wide);
    const int64_t whole = t.thread_floats * nth;
    const int64_t need = whole + (t.split ? (int64_t) t.n_seg * a->n_tok * a->n_head * (DV + 2) : 0);
    t.scratch = a->scratch;
    if (!t.scratch || a->scratch_floats < need) {
        if (t.scratch && a->scratch_floats >= whole) {
            t.split = 0;              /* the same floats, a job per kv head */
        } else {                      /* no scratch given: the backend's own */
            if (c->attn_own_floats < need) {
                free(c->attn_own);
                c->attn_own = malloc(sizeof(float) * (size_t) need);
                c->attn_own_floats = c->attn_own ? need : 0;
            }
            if (!c->attn_own) {
                rm_fail(RM_E_OOM, "cpu backend: out of memory for attention's scratch of %lld floats", (long long) need);
                for (int64_t j = 0; j < (int64_t) a->n_tok * a->n_head * DV; j++) a->out[j] = NAN;
                return;
            }
            t.scratch = c->attn_own;
        }
    }
    t.parts = t.scratch + whole;
    atomic_init(&t.next_job, 0);
    atomic_init(&t.next_row, 0);
    rm_pool_run_shared(c->pool, attn_task_fn, &t);
    if (t.split) {
        rm_pool_run_shared(c->pool, attn_merge_fn, &t);
    }
}

/* ---- the small ops: activations are host memory, so they are the reference math itself ---- */

static void * cpu_alloc(rm_backend * be, uint64_t bytes) {
    void * p = calloc(1, bytes ? (size_t) bytes : 1);
    if (!p) {
        rm_fail(RM_E_OOM, "cpu backend: out of memory for %llu bytes", (unsigned long long) bytes);
    }
    return p;
}

static void cpu_release(rm_backend * be, void * p) { free(p); }

static void cpu_copy(rm_backend * be, void * dst, const void * src, uint64_t bytes) {
    if (dst != src) {
        memcpy(dst, src, (size_t) bytes);
    }
}

static void cpu_zero(rm_backend * be, void * dst, uint64_t bytes) { memset(dst, 0, (size_t) bytes); }

static rm_status cpu_status(rm_backend * be) { return RM_OK; }

/* A prefill's small ops run on every thread: each op's items (rows, tokens or elements) are dealt
 * in chunks of about SPAN_FLOATS floats from a shared counter, so that a step of many tokens does
 * not leave the other threads waiting on the caller (run by one thread of two, these ops took 11%
 * of a 512-token prefill's samples while the other waited). Every item is computed as before,
 * whatever thread takes it: the same floats. An op of one chunk (a decode step) runs on the
 * caller alone. */
#define SPAN_FLOATS 16384

typedef struct span_op span_op;
typedef void (*span_fn)(const span_op * o, int64_t lo, int64_t hi);
struct span_op {                  /* an op's operands; each span_fn reads those it names */
    span_fn fn;
    float * y;
    const float * x, * u;
    const int32_t * rows;
    const rm_rope_yarn * yarn;
    int64_t n, width, ys, xs;      /* ys, xs: row strides where rows are not width apart */
    int32_t n_head, head_dim, n_rot, pos0;
    float f, g;
    int neox, rope;
};

typedef struct {
    const span_op * o;
    int64_t n_items, chunk;
    atomic_llong next;
} span_task;

static void span_task_fn(void * p, int ith, int nth) {
    span_task * t = p;
    for (;;) {
        const int64_t lo = atomic_fetch_add_explicit(&t->next, t->chunk, memory_order_relaxed);
        if (lo >= t->n_items) {
            break;
        }
        t->o->fn(t->o, lo, lo + t->chunk < t->n_items ? lo + t->chunk : t->n_items);
    }
    (void) ith;
    (void) nth;
}

/* o->fn over items [0, n_items), each item_floats floats of work. */
static void run_spans(rm_backend * be, const span_op * o, int64_t n_items, int64_t item_floats) {
    const cpu_ctx * c = be->ctx;
    const int64_t chunk = item_floats >= SPAN_FLOATS ? 1 : SPAN_FLOATS / (item_floats > 0 ? item_floats : 1);
    if (n_items <= chunk || rm_pool_size(c->pool) < 2) {
        o->fn(o, 0, n_items);
        return;
    }
    span_task t = {.o = o, .n_items = n_items, .chunk = chunk};
    atomic_init(&t.next, 0);
    rm_pool_run_shared(c->pool, span_task_fn, &t);
}

static void rmsnorm_span(const span_op * o, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        rm_rmsnorm(o->y + i * o->width, o->x + i * o->width, o->u, o->width, o->f);
    }
}

static void cpu_rmsnorm(rm_backend * be, float * y, const float * x, const rm_weight * w, int64_t n_rows,
                        int64_t n, float eps) {
    const span_op o = {.fn = rmsnorm_span, .y = y, .x = x, .u = w ? (const float *) w->data : NULL, .width = n, .f = eps};
    run_spans(be, &o, n_rows, n);
}

/* RoPE of tokens lo..hi: rope (plain: o->rope 0), rope_yarn (1) or rope_div (2, divisors o->u) */
static void rope_span(const span_op * o, int64_t lo, int64_t hi) {
    const int64_t row = (int64_t) o->n_head * o->head_dim;
    for (int64_t i = lo; i < hi; i++) {
        float * x = o->y + i * row;
        const int32_t pos = o->pos0 + (int32_t) i;
        if (o->rope == 1) {
            rm_rope_yarn_row(x, o->n_head, o->head_dim, o->n_rot, pos, o->yarn, o->neox);
        } else if (o->rope == 2) {
            rm_rope_div(x, o->n_head, o->head_dim, o->n_rot, pos, o->f, o->neox, o->u);
        } else {
            rm_rope(x, o->n_head, o->head_dim, o->n_rot, pos, o->f, o->neox);
        }
    }
}

static void cpu_rope(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                     int32_t pos0, float base, int neox) {
    const span_op o = {.fn = rope_span, .y = x, .n_head = n_head, .head_dim = head_dim, .n_rot = n_rot, .pos0 = pos0,
                       .f = base, .neox = neox};
    run_spans(be, &o, n_tok, (int64_t) n_head * head_dim);
}

static void add_span(const span_op * o, int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; j++) {
        o->y[j] += o->x[j];
    }
}

static void cpu_add(rm_backend * be, float * y, const float * x, int64_t n) {
    const span_op o = {.fn = add_span, .y = y, .x = x};
    run_spans(be, &o, n, 1);
}

static void add_bias_span(const span_op * o, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        for (int64_t j = 0; j < o->width; j++) {
            o->y[i * o->width + j] += o->x[j];
        }
    }
}

static void cpu_add_bias(rm_backend * be, float * y, const rm_weight * b, int64_t n_rows, int64_t n) {
    const span_op o = {.fn = add_bias_span, .y = y, .x = (const float *) b->data, .width = n};
    run_spans(be, &o, n_rows, n);
}

static void add_gated_span(const span_op * o, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        const float g = 1.0f / (1.0f + expf(-o->u[i]));
        for (int64_t j = 0; j < o->width; j++) {
            o->y[i * o->width + j] += g * o->x[i * o->width + j];
        }
    }
}

static void cpu_add_gated(rm_backend * be, float * y, const float * x, const float * gate, int64_t n_rows, int64_t n) {
    const span_op o = {.fn = add_gated_span, .y = y, .x = x, .u = gate, .width = n};
    run_spans(be, &o, n_rows, n);
}

static void swiglu_span(const span_op * o, int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; j++) {
        o->y[j] = o->y[j] / (1.0f + expf(-o->y[j])) * o->x[j];
    }
}

static void cpu_swiglu(rm_backend * be, float * g, const float * u, int64_t n) {
    const span_op o = {.fn = swiglu_span, .y = g, .x = u};
    run_spans(be, &o, n, 4);   /* an expf apiece */
}

static void cpu_rope_yarn(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                          int32_t pos0, const rm_rope_yarn * y, int neox) {
    const span_op o = {.fn = rope_span, .y = x, .yarn = y, .n_head = n_head, .head_dim = head_dim, .n_rot = n_rot,
                       .pos0 = pos0, .neox = neox, .rope = 1};
    run_spans(be, &o, n_tok, (int64_t) n_head * head_dim);
}

static void swiglu_clamp_span(const span_op * o, int64_t lo, int64_t hi) {
    rm_swiglu_clamp_ref(o->y + lo, o->x + lo, hi - lo, o->f, o->g);
}

static void cpu_swiglu_clamp(rm_backend * be, float * g, const float * u, int64_t n, float alpha, float limit) {
    const span_op o = {.fn = swiglu_clamp_span, .y = g, .x = u, .f = alpha, .g = limit};
    run_spans(be, &o, n, 4);
}

static void gather_span(const span_op * o, int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; j++) {
        memcpy(o->y + j * o->width, o->x + (int64_t) o->rows[j] * o->width, sizeof(float) * (size_t) o->width);
    }
}

static void cpu_gather_rows(rm_backend * be, float * dst, const float * src, const int32_t * rows, int32_t n,
                            int64_t width) {
    const span_op o = {.fn = gather_span, .y = dst, .x = src, .rows = rows, .width = width};
    run_spans(be, &o, n, width);
}

/* Destination rows lo..hi of scatter_add, each with its sources (o->rows: the first source of row
 * i at o->rows[i], the next rows' first after its last; then o->n destinations on, the sources' j
 * in increasing order), so each element takes its sources in order j, as one pass over j does. */
static void scatter_span(const span_op * o, int64_t lo, int64_t hi) {
    const int32_t * first = o->rows, * src = o->rows + o->n + 1;
    for (int64_t i = lo; i < hi; i++) {
        float * d = o->y + i * o->width;
        for (int32_t k = first[i]; k < first[i + 1]; k++) {
            const float * v = o->x + (int64_t) src[k] * o->width;
            const float sc = o->u[src[k]];
            for (int64_t c = 0; c < o->width; c++) {
                d[c] += sc * v[c];
            }
        }
    }
}

static void cpu_scatter_add(rm_backend * be, float * dst, const float * src, const int32_t * rows,
                            const float * scale, int32_t n, int64_t width) {
    cpu_ctx * c = be->ctx;
    int32_t n_dst = 0;
    for (int32_t j = 0; j < n; j++) {
        n_dst = rows[j] + 1 > n_dst ? rows[j] + 1 : n_dst;
    }
    const int64_t need = (int64_t) n_dst + 1 + n;
    if ((int64_t) n * width >= 2 * SPAN_FLOATS && c->scatter_cap < need) {
        free(c->scatter);
        c->scatter = malloc(sizeof(int32_t) * (size_t) need);
        c->scatter_cap = c->scatter ? need : 0;
    }
    if ((int64_t) n * width < 2 * SPAN_FLOATS || !c->scatter) {   /* one pass over the sources */
        for (int32_t j = 0; j < n; j++) {
            float * d = dst + (int64_t) rows[j] * width;
            const float * v = src + j * width;
            for (int64_t k = 0; k < width; k++) {
                d[k] += scale[j] * v[k];
            }
        }
        return;
    }
    int32_t * first = c->scatter, * by_dst = c->scatter + n_dst + 1;   /* a counting sort of j by rows[j] */
    memset(first, 0, sizeof(int32_t) * (size_t) (n_dst + 1));
    for (int32_t j = 0; j < n; j++) {
        first[rows[j] + 1]++;
    }
    for (int32_t i = 0; i < n_dst; i++) {
        first[i + 1] += first[i];
    }
    for (int32_t j = 0; j < n; j++) {   /* first[i] walks row i's places, then is put back */
        by_dst[first[rows[j]]++] = j;
    }
    for (int32_t i = n_dst; i > 0; i--) {
        first[i] = first[i - 1];
    }
    first[0] = 0;
    const span_op o = {.fn = scatter_span, .y = dst, .x = src, .rows = first, .u = scale, .n = n_dst, .width = width};
    run_spans(be, &o, n_dst, width * (n / (n_dst > 0 ? n_dst : 1) + 1));
}

static void cpu_route(rm_backend * be, const float * logits, int32_t n_tok, int32_t n_expert, int32_t k, int norm,
                      rm_route * out) {
    for (int32_t i = 0; i < n_tok; i++) {
        rm_route_token(logits + (int64_t) i * n_expert, n_expert, k, norm, out + (int64_t) i * k);
    }
}

void rm_backend_cpu_use_repacked(rm_backend * be, const rm_dev_weights * repacked) {
    ((cpu_ctx *) be->ctx)->repacked = repacked;
}

static void cpu_free(rm_backend * be) {
    if (!be) {
        return;
    }
    cpu_ctx * c = be->ctx;
    free(c->xq);
    free(c->x_info);
    free(c->scores);
    free(c->attn_own);
    free(c->many);
    free(c->xq_many);
    free(c->x_info_many);
    free(c->scatter);
    free(c->xt);
    free(c->xt_many);
    free(c->pack);
    free(c);
    free(be);
}

/* No moe_experts: moe.c composes the routed experts from the ops above. */
static void cpu_mla_attention(rm_backend * be, const rm_mla_args * a) {
    rm_cpu_mla_attention(be, ((cpu_ctx *) be->ctx)->pool, a);
}

static void cpu_dsa_select(rm_backend * be, const rm_dsa_args * a) {
    rm_cpu_dsa_select(((cpu_ctx *) be->ctx)->pool, a);
}

static void cpu_qsa_select(rm_backend * be, const rm_qsa_args * a) {
    rm_cpu_qsa_select(((cpu_ctx *) be->ctx)->pool, a);
}

static void cpu_ple_gate(rm_backend * be, float * out, const float * key, const float * query, const float * value,
                         int64_t n_tok, int64_t hc, int64_t n) {
    rm_cpu_ple_gate(((cpu_ctx *) be->ctx)->pool, out, key, query, value, n_tok, hc, n);
}

static void cpu_ple_conv(rm_backend * be, const rm_ple_conv_args * a) {
    rm_cpu_ple_conv(((cpu_ctx *) be->ctx)->pool, a);
}

static void cpu_dsv4_attention(rm_backend * be, const rm_dsv4_attn_args * a) {
    rm_cpu_dsv4_attention(((cpu_ctx *) be->ctx)->pool, a);
}

static void cpu_csa_select(rm_backend * be, const rm_csa_args * a) {
    rm_cpu_csa_select(((cpu_ctx *) be->ctx)->pool, a);
}

static void cpu_compress(rm_backend * be, const rm_compress_args * a) {
    rm_cpu_compress(((cpu_ctx *) be->ctx)->pool, a);
}

static void cpu_mhc_weights(rm_backend * be, float * mix, const rm_weight * scale, const rm_weight * base,
                            int64_t n_tok, int64_t hc, int64_t n_mix, int32_t iters, float eps) {
    rm_cpu_mhc_weights(((cpu_ctx *) be->ctx)->pool, mix, (const float *) scale->data, (const float *) base->data, n_tok,
                       hc, n_mix, iters, eps);
}

static void cpu_mhc_collapse(rm_backend * be, float * y, const float * h, const float * mix, int64_t n_mix,
                             int64_t n_tok, int64_t hc, int64_t n) {
    rm_cpu_mhc_collapse(((cpu_ctx *) be->ctx)->pool, y, h, mix, n_mix, n_tok, hc, n);
}

static void cpu_mhc_expand(rm_backend * be, float * h, const float * b, const float * mix, int64_t n_tok, int64_t hc,
                           int64_t n) {
    rm_cpu_mhc_expand(((cpu_ctx *) be->ctx)->pool, h, b, mix, n_tok, hc, n);
}

static void cpu_layernorm(rm_backend * be, float * y, const float * x, const rm_weight * w, const rm_weight * b,
                          int64_t n_rows, int64_t n, float eps) {
    rm_cpu_layernorm(y, x, (const float *) w->data, (const float *) b->data, n_rows, n, eps);
}

static void cpu_route_gated(rm_backend * be, const float * logits, const rm_weight * bias, const rm_gating_params * g,
                            int32_t n_tok, int32_t n_expert, int32_t k, rm_route * out) {
    for (int32_t i = 0; i < n_tok; i++) {
        rm_route_token_gated(logits + (int64_t) i * n_expert, bias ? (const float *) bias->data : NULL, g, n_expert, k,
                             g->hash ? g->hash + (int64_t) i * k : NULL, out + (int64_t) i * k);
    }
}

static void cpu_gdn(rm_backend * be, const rm_gdn_args * a) { rm_cpu_gdn(((cpu_ctx *) be->ctx)->pool, a); }

static void cpu_copy_rows(rm_backend * be, float * dst, int64_t dst_stride, const float * src, int64_t src_stride,
                          int64_t width, int64_t n_rows) {
    for (int64_t r = 0; r < n_rows; r++) {
        memmove(dst + r * dst_stride, src + r * src_stride, sizeof(float) * (size_t) width);
    }
}

static void geglu_span(const span_op * o, int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; r++) {
        float * gr = o->y + r * o->ys;
        const float * ur = o->x + r * o->xs;
        for (int64_t j = 0; j < o->width; j++) {
            gr[j] = rm_gelu(gr[j]) * ur[j];
        }
    }
}

static void cpu_geglu(rm_backend * be, float * g, int64_t g_stride, const float * u, int64_t u_stride, int64_t width,
                      int64_t n_rows) {
    const span_op o = {.fn = geglu_span, .y = g, .x = u, .width = width, .ys = g_stride, .xs = u_stride};
    run_spans(be, &o, n_rows, 4 * width);
}

static void scale_span(const span_op * o, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        o->y[i] *= o->f;
    }
}

static void cpu_scale(rm_backend * be, float * x, int64_t n, float f) {
    const span_op o = {.fn = scale_span, .y = x, .f = f};
    run_spans(be, &o, n, 1);
}

static void cpu_rope_div(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                         int32_t pos0, float base, int neox, const rm_weight * div) {
    const span_op o = {.fn = rope_span, .y = x, .u = div ? (const float *) div->data : NULL, .n_head = n_head,
                       .head_dim = head_dim, .n_rot = n_rot, .pos0 = pos0, .f = base, .neox = neox, .rope = 2};
    run_spans(be, &o, n_tok, (int64_t) n_head * head_dim);
}

static void mul_sigmoid_span(const span_op * o, int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; r++) {
        const float d = 1.0f + expf(-o->x[r]);
        for (int64_t j = 0; j < o->width; j++) {
            o->y[r * o->width + j] /= d;
        }
    }
}

static void cpu_mul_sigmoid(rm_backend * be, float * y, const float * gate, int64_t n, int64_t width) {
    const span_op o = {.fn = mul_sigmoid_span, .y = y, .x = gate, .width = width};
    run_spans(be, &o, n, width);
}

/* ---- hyper-connections ---------------------------------------------------------------------- */

static void rmsnorm_groups_span(const span_op * o, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        rm_rmsnorm(o->y + i * o->width, o->x + i * o->width, o->u + (i % o->n) * o->width, o->width, o->f);
    }
}

static void cpu_rmsnorm_groups(rm_backend * be, float * y, const float * x, const rm_weight * w, int64_t n_rows,
                               int64_t n, int64_t n_groups, float eps) {
    const span_op o = {.fn = rmsnorm_groups_span, .y = y, .x = x, .u = (const float *) w->data, .width = n,
                       .n = n_groups, .f = eps};
    run_spans(be, &o, n_rows, n);
}

static void silu_span(const span_op * o, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        const float v = o->f * o->y[i];
        o->y[i] = v / (1.0f + expf(-v));
    }
}

static void cpu_silu(rm_backend * be, float * x, int64_t n, float f) {
    const span_op o = {.fn = silu_span, .y = x, .f = f};
    run_spans(be, &o, n, 1);
}

/* token t: o->n streams of o->width floats */
static void hc_mix_span(const span_op * o, int64_t lo, int64_t hi) {
    const int64_t hc = o->n, n = o->width;
    for (int64_t t = lo; t < hi; t++) {
        float * y = o->y + t * n;
        const float * x = o->x + t * hc * n, * g = o->u + t * hc * n;
        for (int64_t j = 0; j < n; j++) {
            float sum = 0.0f;
            for (int64_t c = 0; c < hc; c++) {
                sum += x[c * n + j] / (1.0f + expf(-g[c * n + j]));
            }
            y[j] = sum / (float) hc;
        }
    }
}

static void cpu_hc_mix(rm_backend * be, float * y, const float * x, const float * gate, int64_t n_tok, int64_t hc,
                       int64_t n) {
    const span_op o = {.fn = hc_mix_span, .y = y, .x = x, .u = gate, .n = hc, .width = n};
    run_spans(be, &o, n_tok, hc * n);
}

static void hc_add_span(const span_op * o, int64_t lo, int64_t hi) {
    const int64_t hc = o->n, n = o->width;
    for (int64_t t = lo; t < hi; t++) {
        const float * b = o->x + t * n;
        for (int64_t c = 0; c < hc; c++) {
            const float w = 2.0f / (1.0f + expf(-o->u[t * hc + c] / (float) hc));
            float * h = o->y + (t * hc + c) * n;
            for (int64_t j = 0; j < n; j++) {
                h[j] += w * b[j];
            }
        }
    }
}

static void cpu_hc_add(rm_backend * be, float * h, const float * b, const float * inj, int64_t n_tok, int64_t hc,
                       int64_t n) {
    const span_op o = {.fn = hc_add_span, .y = h, .x = b, .u = inj, .n = hc, .width = n};
    run_spans(be, &o, n_tok, hc * n);
}

static const rm_backend_ops CPU_OPS = {
    .name        = "cpu",
    .alloc       = cpu_alloc,
    .release     = cpu_release,
    .upload      = cpu_copy,
    .download    = cpu_copy,
    .copy        = cpu_copy,
    .zero        = cpu_zero,
    .status      = cpu_status,
    .matmul      = cpu_matmul,
    .matmul_many = cpu_matmul_many,
    .attention   = cpu_attention,
    .rmsnorm     = cpu_rmsnorm,
    .rope        = cpu_rope,
    .add         = cpu_add,
    .add_bias    = cpu_add_bias,
    .add_gated   = cpu_add_gated,
    .swiglu      = cpu_swiglu,
    .rope_yarn   = cpu_rope_yarn,
    .swiglu_clamp = cpu_swiglu_clamp,
    .gather_rows = cpu_gather_rows,
    .scatter_add = cpu_scatter_add,
    .route       = cpu_route,
    .route_gated = cpu_route_gated,
    .mla_attention = cpu_mla_attention,
    .dsa_select  = cpu_dsa_select,
    .qsa_select  = cpu_qsa_select,
    .layernorm   = cpu_layernorm,
    .gdn         = cpu_gdn,
    .copy_rows   = cpu_copy_rows,
    .mul_sigmoid = cpu_mul_sigmoid,
    .geglu       = cpu_geglu,
    .scale       = cpu_scale,
    .rope_div    = cpu_rope_div,
    .rmsnorm_groups = cpu_rmsnorm_groups,
    .silu        = cpu_silu,
    .hc_mix      = cpu_hc_mix,
    .hc_add      = cpu_hc_add,
    .ple_gate    = cpu_ple_gate,
    .ple_conv    = cpu_ple_conv,
    .mhc_weights = cpu_mhc_weights,
    .mhc_collapse = cpu_mhc_collapse,
    .mhc_expand  = cpu_mhc_expand,
    .compress    = cpu_compress,
    .csa_select  = cpu_csa_select,
    .dsv4_attention = cpu_dsv4_attention,
    .free        = cpu_free,
};

rm_backend * rm_backend_cpu_new(rm_pool * pool, int32_t n_batch, int64_t max_in, int32_t n_ctx) {
    rm_backend * be = calloc(1, sizeof(*be));
    cpu_ctx * c = calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        return NULL;
    }
    c->pool = pool;
    c->xq_cap = (uint64_t) n_batch * (uint64_t) (max_in / 32 + 1) * 72 + 64;  /* room for F16 activations, the widest */
    c->xq = malloc(c->xq_cap);
    c->x_info_cap = (int64_t) n_batch * 2 * (max_in / 32 + 1);
    c->x_info = malloc(sizeof(float) * (size_t) c->x_info_cap);
    c->scores_room = ATTN_ROWS * ATTN_TILE + 16;
    c->scores = malloc(sizeof(float) * (size_t) c->scores_room * (size_t) rm_pool_size(pool));
    /* matmul_many: a base and a residual type of n_batch rows, each row padded to 64 bytes */
    c->xq_many_cap = 2 * (uint64_t) n_batch * ((uint64_t) (max_in / 32 + 1) * 72 + 64);
    c->xq_many = malloc(c->xq_many_cap);
    c->x_info_many_cap = 2 * c->x_info_cap;
    c->x_info_many = malloc(sizeof(float) * (size_t) c->x_info_many_cap);
    /* its deal's shares sit on cache lines of their own: the struct wants 64-byte alignment */
    c->many = aligned_alloc(64, (sizeof(struct many_task) + 63) / 64 * 64);
    /* the prefill form: transposed activations (at most the quantized bytes), packing room */
    c->xt_cap = c->xq_cap;
    c->xt = malloc(c->xt_cap);
    c->xt_many_cap = c->xq_many_cap;
    c->xt_many = malloc(c->xt_many_cap);
    const uint64_t tile_room = rm_cpu_tile_room_isa(rm_isa_active(), max_in);
    c->pack_stride = tile_room > MM_PACK_BYTES ? (tile_room + 63) / 64 * 64 : MM_PACK_BYTES;
    c->pack = malloc((size_t) c->pack_stride * (size_t) rm_pool_size(pool));
    if (!c->xq || !c->x_info || !c->scores || !c->xq_many || !c->x_info_many || !c->many || !c->xt || !c->xt_many ||
        !c->pack) {
        be->ctx = c;
        cpu_free(be);
        return NULL;
    }
    be->ops = &CPU_OPS;
    be->ctx = c;
    snprintf(be->stats.backend, sizeof(be->stats.backend), "cpu");
    be->stats.auto_budget = -1.0f;
    return be;
}

void rm_softmax(float * x, int64_t n) { rm_softmax_sink(x, n, -INFINITY); }   /* no sink: exp(-inf) adds 0 */

/* softmax over the router logits, top-k, optional renormalisation (gguf-facts §3 pipeline). */
void rm_route_token(const float * logits, int32_t n_expert, int32_t k, int norm, rm_route * r) {
    float probs[512];
    memcpy(probs, logits, sizeof(float) * (size_t) n_expert);
    rm_softmax(probs, n_expert);
    uint8_t taken[512] = {0};
    float sum = 0.0f;
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n_expert; e++) {
            if (!taken[e] && (best < 0 || probs[e] > probs[best])) {
                best = e;
            }
        }
        taken[best] = 1;
        r[j].expert = best;
        r[j].prob = probs[best];
        r[j].weight = probs[best];
        r[j].residual = 0;
        sum += probs[best];
    }
    if (norm) {
        const float inv = 1.0f / (sum > 6.103515625e-5f ? sum : 6.103515625e-5f);
        for (int32_t j = 0; j < k; j++) {
            r[j].weight *= inv;
        }
    }
}
