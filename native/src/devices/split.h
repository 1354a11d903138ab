/* split.h - internal: the host side of the CPU/device split of a MoE block (docs/SPLIT.md).
 *
 * Shared by the two device backends, CUDA (native/cuda/backend.cu) and the CPU stand-in
 * (standin.c): both run one block with rm_split_run, the one written sequence of the split's
 * steps, over a few operations of their device (rm_split_device_ops: native/cuda/split.cu and
 * standin.c). So both decide the same way where each slot's work runs, compute the host's share
 * with the same code, and queue the device's copies, kernels and events in the same order: the
 * stand-in's tests check the order the GPU runs. Slots are (token, choice) pairs,
 * S = n_tok * n_expert_used; "compact rows" are the slots in expert order, as rm_moe_args groups
 * them (residual slots first within an expert).
 *
 * Where a slot's work runs:
 *   - the expert's base is on the device and the slot gets no residual: the device, whole;
 *   - the base is on the device and the slot gets its residual (a "fix" slot): the device
 *     computes x.B_g and x.B_u, the host x.R_g and x.R_u; with both, the host forms
 *     h' = silu(g_B + g_R) * (u_B + u_R) and h'.R_d, and the device h'.B_d;
 *   - in prefill, an expert whose residual at least upload_min_tokens rows need has its residual
 *     copied to the device for the batch (at most RM_SPLIT_STAGE_MAX experts per block): its
 *     slots then run on the device whole;
 *   - the expert's base is in host memory: the host, whole (base, and residual where selected).
 * gpt-oss's expert biases are added where the base product lands (the device's gate/up before the
 * fix rows go down, so h' sees them; its down, and the fix rows' h'.B_d, once), or by the host for
 * the experts it computes whole; its clamped SwiGLU replaces silu on both sides. */
#ifndef RM_SPLIT_H
#define RM_SPLIT_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RM_SPLIT_STAGE_MAX 4

/* A run of compact rows of one expert: {expert (matrix index), first row, rows}. */
typedef struct rm_split_group {
    int32_t mat;
    int32_t row0;
    int32_t n;
} rm_split_group;

/* Byte offsets of the plan's tables for S slots, in one buffer (the same layout on both sides
 * of the bus: the CUDA backend copies the buffer up as it is). */
typedef struct rm_split_layout {
    uint64_t groups, fix_groups;          /* rm_split_group[S] each */
    uint64_t tok_of_row;                  /* int32[S]: token of each compact row */
    /* by place: token t's slots are places t * K .. t * K + K - 1 in the order of their experts,
     * the order in which the CPU backend adds them (moe.c), so that the one combine adds the same
     * floats in the same order */
    uint64_t slot_row, fix_of_slot, host_of_slot;   /* int32[S] by place, -1: none */
    uint64_t fix_rows;                    /* int32[S]: compact row of each fix row */
    uint64_t w;                           /* float[S] by place: the routing weight */
    uint64_t end;
} rm_split_layout;

/* Inline, so that sizes.c (which split.c calls for its buffers' sizes) can size the table
 * without calling back into split.c. */
static inline rm_split_layout rm_split_layout_for(int64_t S) {
    rm_split_layout l;
    uint64_t o = 0;
    const uint64_t g = sizeof(rm_split_group) * (uint64_t) S, i = sizeof(int32_t) * (uint64_t) S;
#define RM_TAKE(field, n) l.field = o; o += ((n) + 15) / 16 * 16
    RM_TAKE(groups, g);
    RM_TAKE(fix_groups, g);
    RM_TAKE(tok_of_row, i);
    RM_TAKE(slot_row, i);
    RM_TAKE(fix_of_slot, i);
    RM_TAKE(host_of_slot, i);
    RM_TAKE(fix_rows, i);
    RM_TAKE(w, i);
#undef RM_TAKE
    l.end = o;
    return l;
}

/* Bytes one expert's three residual matrices take in a staging buffer (the largest layer's,
 * back to back, rounded up by rm_dev_round_up). */
uint64_t rm_split_stage_bytes(const rm_model * m);

typedef struct rm_split_plan {
    rm_split_layout  lay;
    rm_split_group * groups;              /* device experts' rows (all their slots) */
    rm_split_group * fix_groups;          /* by fix row: the fix slots of each device expert */
    int32_t *        tok_of_row, * slot_row, * fix_of_slot, * host_of_slot, * fix_rows;
    float *          w;
    int32_t          n_groups, max_c, n_fix_groups, max_fix, n_fix;
    int32_t          n_host_groups;       /* experts the host computes whole */
    int32_t          n_host_rows;         /* host rows: the fix rows, then the host experts' rows */
    int32_t          n_stage;
    rm_split_group   stage[RM_SPLIT_STAGE_MAX];   /* {expert, first compact row, residual rows} */
    int32_t *        host_groups;         /* n_host_groups rows of {expert, first row, rows, residual rows} */
} rm_split_plan;

/* Plans one block into tab (at least rm_split_layout_for(S).end bytes) and host_groups
 * (4 * n_expert int32). exp_tab: the device's expert table (devweights.h order, n_expert
 * experts); an expert is on the device when its three base matrices are. can_stage: the device
 * may take residual copies this block; upload_min_tokens: the crossover (0: never). */
void rm_split_make_plan(const rm_moe_args * a, const uint8_t * const * exp_tab, int can_stage,
                        int32_t upload_min_tokens, uint8_t * tab, int32_t * host_groups, rm_split_plan * p);

/* The host's buffers. Host row r's input is xs[r]; its gate/up go to gs/us and its down result
 * (weight not applied) to hr. x: the block input, n_tok rows of n_embd, from the device; gf/uf:
 * the device's base gate/up of the fix rows; hf: the fix rows' h', to the device. */
typedef struct rm_split_host {
    rm_backend * cpu;
    const float * x;
    float *      xs, * gs, * us;
    const float * gf, * uf;
    float *      hf, * hr;
} rm_split_host;

/* The host's share before it needs the device's results: the fix rows' x.R_g and x.R_u, and
 * the host experts whole. */
void rm_split_host_first(const rm_split_host * h, const rm_moe_args * a, const rm_split_plan * p);
/* With the device's base gate/up of the fix rows: h' and h'.R_d. */
void rm_split_host_second(const rm_split_host * h, const rm_moe_args * a, const rm_split_plan * p);

/* ---- one block, for every device ------------------------------------------------------------
 *
 * rm_split_run queues the device's base work and the copies the host needs, computes the host's
 * share while the device runs, then queues the fix-up; it counts what crosses the bus in
 * be->stats. The device operations below are all it asks of a device. Those that queue work
 * (upload to combine, record) run in call order on the device's one stream (the stand-in runs
 * each at once); each returns 0 once the backend has an error (recorded by the op, the backend's
 * sticky one) and the sequence then stops. `what` names the step in an error message. Pointers
 * named ..._d are device memory, ..._h host memory. */

/* Points the sequence marks on the device's stream. */
enum {
    RM_SPLIT_EV_INPUT = 0,    /* the block input has come down (x_h) */
    RM_SPLIT_EV_FIX   = 1,    /* the fix rows' base gate/up have come down (gf_h, uf_h) */
    RM_SPLIT_EV_BASE0 = 2,    /* the device's base work of the layer begins ... */
    RM_SPLIT_EV_BASE1 = 3,    /* ... and ends: the layer's device time */
};

typedef struct rm_split_device_ops {
    /* the scratch: device memory, and host memory the device copies from and to (pinned on a
     * GPU); NULL with the error recorded */
    void * (*dev_alloc)(rm_backend * be, uint64_t bytes);
    void   (*dev_free)(rm_backend * be, void * p, uint64_t bytes);
    void * (*host_alloc)(rm_backend * be, uint64_t bytes);
    void   (*host_free)(rm_backend * be, void * p);
    /* records st and msg as the backend's error unless it has one; returns 0 */
    int    (*fail)(rm_backend * be, rm_status st, const char * msg);
    /* whether the backend has an error (an earlier op failed) */
    int    (*has_error)(rm_backend * be);
    /* whether L's residual matrices can run on the device when copied there (its kernels take
     * their types) */
    int    (*can_stage)(rm_backend * be, const rm_layer * L);

    int (*upload)(rm_backend * be, void * dst_d, const void * src_h, uint64_t bytes, const char * what);
    /* dst_h is written once an event recorded after it has passed (wait) */
    int (*download)(rm_backend * be, void * dst_h, const void * src_d, uint64_t bytes, const char * what);
    /* dst[j] = src[rows_d[j]], j < n, rows of width floats */
    int (*gather)(rm_backend * be, float * dst_d, const float * src_d, const int32_t * rows_d, int32_t n,
                  int64_t width, const char * what);
    /* y = W x for each group {expert, first row, rows} of groups_d (n_groups, the largest of
     * max_rows rows), W the group's expert matrix of w (which: RM_EXP_*) in layer il, n_in x n_out */
    int (*experts_matmul)(rm_backend * be, const rm_weight * w, int il, int which, int64_t n_in, int64_t n_out,
                          const rm_split_group * groups_d, int32_t n_groups, int32_t max_rows, const float * x_d,
                          int64_t x_stride, float * y_d, int64_t y_stride, const char * what);
    /* y += W x for n rows, W a matrix of w's type and shape copied to the device at data_d */
    int (*staged_matmul)(rm_backend * be, const rm_weight * w, const uint8_t * data_d, int64_t n_in, int64_t n_out,
                         int32_t n, const float * x_d, int64_t x_stride, float * y_d, int64_t y_stride,
                         const char * what);
    /* g = silu(g) u over n floats */
    int (*swiglu)(rm_backend * be, float * g_d, const float * u_d, int64_t n, const char * what);
    /* g = gelu(g) * u over n floats (Gemma 4's experts, rm_gelu) */
    int (*geglu)(rm_backend * be, float * g_d, const float * u_d, int64_t n, const char * what);
    /* the clamped forms of swiglu (rm_swiglu_clamp_ref): gpt-oss's, Step-3.5's limited one */
    int (*swiglu_clamp)(rm_backend * be, float * g_d, const float * u_d, int64_t n, float alpha, float limit,
                        const char * what);
    /* y[row] += row `mat` of the per-expert bias b (ne = {width, n_expert}) for each row of each
     * group of groups_d (n_groups, the largest of max_rows rows) */
    int (*experts_bias)(rm_backend * be, const rm_weight * b, const rm_split_group * groups_d, int32_t n_groups,
                        int32_t max_rows, float * y_d, int64_t y_stride, const char * what);
    /* out[t] += w_d[s] * v_s for t's places s = t * K + k, k = 0 .. K - 1 in order, one add each
     * (rows of E floats): v_s = dev[dev_row_d[s]] where that is >= 0, else fix[fix_row_d[s]] +
     * host[host_row_d[s]] where fix_row_d[s] >= 0 (a fix slot: h'.B_d + h'.R_d, as the CPU's
     * accumulating product adds them), else host[host_row_d[s]]; places with all three -1 add nothing */
    int (*combine)(rm_backend * be, float * out_d, const float * dev_d, const float * fix_d, const float * host_d,
                   const int32_t * dev_row_d, const int32_t * fix_row_d, const int32_t * host_row_d, const float * w_d,
                   int32_t n_tok, int32_t K, int64_t E, const char * what);
    /* marks point ev (RM_SPLIT_EV_*) of layer il on the stream; wait blocks the host until the
     * last mark of ev has passed */
    int (*record)(rm_backend * be, int ev, int il, const char * what);
    int (*wait)(rm_backend * be, int ev, const char * what);
    /* layer il's host share took host_us (be->layer_cpu_us[il] holds it): the device notes its
     * own time of the layer, from the BASE0/BASE1 marks, now or when it next waits */
    void (*layer_timed)(rm_backend * be, int il, double host_us);
} rm_split_device_ops;

/* A session's split: its device, and the scratch of one block (rm_split_init). Slots are (token,
 * choice) pairs, S = n * n_expert_used; rows are the slots in expert order ("compact" rows). */
typedef struct rm_split_state {
    /* set by the backend before rm_split_init */
    const rm_split_device_ops * dev;
    rm_backend *           host;          /* the CPU backend on the model's threads */
    const uint8_t * const * exp_tab;      /* the device's expert table (devweights.h order), host copy */
    int32_t                upload_min_tokens;
    const char *           who;           /* the backend, in messages: "cuda backend" */

    int64_t   max_slots;
    /* device */
    float *   xc, * gc, * uc, * dc;       /* compact rows: inputs, gate, up (then h), down */
    float *   gf, * uf;                   /* the fix rows' base gate/up, gathered to go to the host */
    float *   hf, * df;                   /* the fix rows' corrected h (from the host) and B_d h */
    float *   hr;                         /* host results, already weighted, rows of n_embd */
    uint8_t * tab;                        /* the plan's tables */
    uint8_t * stage;                      /* residual matrices copied for prefill, RM_SPLIT_STAGE_MAX slots */
    uint64_t  stage_bytes;
    uint64_t  dev_bytes[10];              /* of xc .. hr, tab: what rm_split_free gives back */
    /* host, reached by the device's copies */
    uint8_t * tab_h;
    float *   x_h;                        /* the block input, n_batch rows of n_embd */
    float *   gf_h, * uf_h;               /* from the device: base gate/up of the fix rows */
    float *   hf_h;                       /* to the device: corrected h of the fix rows */
    float *   hr_h;                       /* to the device: host results */
    /* plain host scratch for the host's products: rows in host order (fix rows, then the host
     * experts' rows) */
    float *   xs, * gs, * us;
    int32_t * host_groups;                /* n_expert rows of {expert, first row, rows, residual rows} */
} rm_split_state;

/* Allocates the scratch for n_batch tokens through sp->dev; 0 on failure (the error recorded). */
int  rm_split_init(rm_backend * be, rm_split_state * sp, const rm_model * m, int32_t n_batch);
/* Gives back what rm_split_init got (also after it failed part way). */
void rm_split_free(rm_backend * be, rm_split_state * sp);
/* The routed experts of one MoE block (rm_moe_args), split between the device and the host. */
void rm_split_run(rm_backend * be, rm_split_state * sp, const rm_moe_args * a);

#ifdef __cplusplus
}
#endif

#endif
