/* split.h - internal: the host side of the CPU/device split of a MoE block (docs/SPLIT.md).
 *
 * Shared by the two device backends, CUDA (native/cuda/split.cu) and the CPU stand-in
 * (standin.c), so both decide the same way where each slot's work runs and compute the host's
 * share with the same code; only the device's part differs. Slots are (token, choice) pairs,
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
 *   - the expert's base is in host memory: the host, whole (base, and residual where selected). */
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
    uint64_t slot_row, fix_of_slot, host_of_slot;   /* int32[S] by slot, -1: none */
    uint64_t fix_rows;                    /* int32[S]: compact row of each fix row */
    uint64_t w_gpu, w_fix, w_host;        /* float[S] by slot */
    uint64_t end;
} rm_split_layout;

rm_split_layout rm_split_layout_for(int64_t n_slots);

/* Bytes one expert's three residual matrices take in a staging buffer (the largest layer's,
 * back to back, rounded up to 256). */
uint64_t rm_split_stage_bytes(const rm_model * m);

typedef struct rm_split_plan {
    rm_split_layout  lay;
    rm_split_group * groups;              /* device experts' rows (all their slots) */
    rm_split_group * fix_groups;          /* by fix row: the fix slots of each device expert */
    int32_t *        tok_of_row, * slot_row, * fix_of_slot, * host_of_slot, * fix_rows;
    float *          w_gpu, * w_fix, * w_host;
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

#ifdef __cplusplus
}
#endif

#endif
