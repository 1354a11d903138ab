/* split.cu - the routed experts of one MoE block on the CUDA backend (docs/SPLIT.md).
 *
 * The GPU computes every activated slot's base, x.B, for the experts whose bases it holds. Host
 * threads compute, next to the residuals in host memory:
 *   - the "fix" slots, those the residual policy selected: x.R_g and x.R_u while the GPU does the
 *     bases; then, with the GPU's x.B_g and x.B_u of those rows, h' = silu(g) * u of the full
 *     precision and h'.R_d. The GPU then runs h'.B_d for those rows;
 *   - the experts whose bases stay in host memory (the placement's choice), whole.
 * Only activations cross: the block input (n_embd floats per token) and the fix rows' base
 * gate/up go down, the fix rows' h' and the host results (n_ff + n_embd floats per fix slot)
 * come up, plus a few index tables. In prefill, an expert whose residual is needed by at least
 * residual_upload_min_tokens rows has its residual matrices copied to the GPU instead (up to
 * RM_CU_STAGE_EXPERTS experts per block), when that is cheaper than the host's GEMM.
 *
 * Order of a block: the host plans (which rows go where), queues the GPU's base work and the
 * copies the host needs, computes while the GPU runs, then queues the fix-up. Layer times (host
 * compute vs the GPU's base work, from events) feed residual_budget = "auto".
 *
 * The pinned buffers are reused every block without waiting for their copies: the routing of
 * the next block (cu_route) waits for the whole stream first, so the copies have run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.cuh"
#include "matmul.cuh"
extern "C" {
#include "split.h"
}
#include "rows.cuh"
#include "swiglu.cuh"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e6 + (double) ts.tv_nsec * 1e-3;
}

/* ---- scratch -------------------------------------------------------------------------------- */

static void * dev(cuda_be * c, uint64_t bytes) {
    void * p = rm_gpu_malloc(c->g, bytes, "cuda backend: the split's scratch");
    if (!p && c->err == RM_OK) {
        c->err = RM_E_OOM;
        snprintf(c->msg, sizeof(c->msg), "%s", rm_last_error());
    }
    return p;
}

static void * pinned(cuda_be * c, uint64_t bytes) {
    void * p = NULL;
    return rm_cuda_check(c, cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault), "pinned host memory") ? p : NULL;
}

/* Sizes of the device buffers, in the order rm_cuda_split_init allocates them. */
static void device_sizes(const cuda_be * c, uint64_t out[10]) {
    const rm_hparams * hp = &c->m->hp;
    const uint64_t S = (uint64_t) c->sp.max_slots, E = (uint64_t) hp->n_embd, F = (uint64_t) hp->n_ff_exp;
    const uint64_t f = sizeof(float);
    const uint64_t sizes[10] = {f * S * E, f * S * F, f * S * F, f * S * E, f * S * F, f * S * F, f * S * F,
                                f * S * E, f * S * E, rm_split_layout_for((int64_t) S).end};
    memcpy(out, sizes, sizeof(sizes));
}

int rm_cuda_split_init(cuda_be * c) {
    cuda_split * sp = &c->sp;
    const rm_hparams * hp = &c->m->hp;
    sp->max_slots = (int64_t) c->n_batch * hp->n_expert_used;
    const uint64_t S = (uint64_t) sp->max_slots, E = (uint64_t) hp->n_embd, F = (uint64_t) hp->n_ff_exp;
    const uint64_t f = sizeof(float);
    uint64_t sz[10];
    device_sizes(c, sz);
    float ** bufs[9] = {&sp->xc, &sp->gc, &sp->uc, &sp->dc, &sp->gf, &sp->uf, &sp->hf, &sp->df, &sp->hr};
    for (int i = 0; i < 9; i++) {
        if (!(*bufs[i] = (float *) dev(c, sz[i]))) return 0;
    }
    if (!(sp->tab = (uint8_t *) dev(c, sz[9]))) return 0;
    if (c->g->upload_min_tokens > 0 && c->m->residual) {
        sp->stage_bytes = RM_CU_STAGE_EXPERTS * rm_split_stage_bytes(c->m);
        if (!(sp->stage = (uint8_t *) dev(c, sp->stage_bytes))) return 0;
    }
    sp->tab_cap = sz[9];
    if (!(sp->tab_h = (uint8_t *) pinned(c, sp->tab_cap)) ||
        !(sp->x_h = (float *) pinned(c, f * (uint64_t) c->n_batch * E)) ||
        !(sp->gf_h = (float *) pinned(c, f * S * F)) || !(sp->uf_h = (float *) pinned(c, f * S * F)) ||
        !(sp->hf_h = (float *) pinned(c, f * S * F)) || !(sp->hr_h = (float *) pinned(c, f * S * E))) {
        return 0;
    }
    sp->xs = (float *) malloc(f * S * E);
    sp->gs = (float *) malloc(f * S * F);
    sp->us = (float *) malloc(f * S * F);
    sp->host_groups = (int32_t *) malloc(sizeof(int32_t) * 4 * (size_t) hp->n_expert);
    if (!sp->xs || !sp->gs || !sp->us || !sp->host_groups) {
        if (c->err == RM_OK) {
            c->err = RM_E_OOM;
            snprintf(c->msg, sizeof(c->msg), "cuda backend: out of host memory for the split's scratch");
        }
        return 0;
    }
    return 1;
}

void rm_cuda_split_free(cuda_be * c) {
    cuda_split * sp = &c->sp;
    uint64_t sz[10];
    device_sizes(c, sz);
    float * bufs[9] = {sp->xc, sp->gc, sp->uc, sp->dc, sp->gf, sp->uf, sp->hf, sp->df, sp->hr};
    for (int i = 0; i < 9; i++) {
        if (bufs[i]) rm_gpu_free(c->g, bufs[i], sz[i]);
    }
    if (sp->tab) rm_gpu_free(c->g, sp->tab, sz[9]);
    if (sp->stage) rm_gpu_free(c->g, sp->stage, sp->stage_bytes);
    void * pins[6] = {sp->tab_h, sp->x_h, sp->gf_h, sp->uf_h, sp->hf_h, sp->hr_h};
    for (int i = 0; i < 6; i++) {
        if (pins[i]) cudaFreeHost(pins[i]);
    }
    free(sp->xs);
    free(sp->gs);
    free(sp->us);
    free(sp->host_groups);
    memset(sp, 0, sizeof(*sp));
}

/* ---- one block ------------------------------------------------------------------------------ */

static int residuals_fit_kernels(const rm_layer * L) {
    return L->gate_res.data && rm_cu_matmul_supports(L->gate_res.type, L->gate_res.ne[0]) &&
           rm_cu_matmul_supports(L->up_res.type, L->up_res.ne[0]) && rm_cu_matmul_supports(L->down_res.type, L->down_res.ne[0]);
}

static rm_split_host host_side(cuda_be * c) {
    cuda_split * sp = &c->sp;
    rm_split_host h = {c->host, sp->x_h, sp->xs, sp->gs, sp->us, sp->gf_h, sp->uf_h, sp->hf_h, sp->hr_h};
    return h;
}

#define CK(call, what) if (!rm_cuda_check(c, (call), what)) return

void rm_cuda_moe_experts(rm_backend * be, const rm_moe_args * a) {
    cuda_be * c = (cuda_be *) be->ctx;
    cuda_split * sp = &c->sp;
    const rm_gpu * g = c->g;
    const rm_layer * L = a->L;
    const int il = a->layer;
    const int32_t K = a->n_expert_used, S = a->n_tok * K;
    const int64_t E = a->n_embd, F = a->n_ff;
    const uint64_t f = sizeof(float);
    c->cpu_us[il] = c->gpu_us[il] = 0.0f;
    if (c->err || S <= 0) return;
    if (S > sp->max_slots) {
        c->err = RM_E_INTERNAL;
        snprintf(c->msg, sizeof(c->msg), "cuda backend: %d slots exceed the split's %lld", S, (long long) sp->max_slots);
        return;
    }
    rm_split_plan p;
    const int can_stage = sp->stage && residuals_fit_kernels(L);
    rm_split_make_plan(a, g->exp_tab_host, can_stage, g->upload_min_tokens, sp->tab_h, sp->host_groups, &p);
    const int host_work = p.n_host_rows > 0;   /* fix rows and host experts' rows */
    const uint8_t * const * tab = g->exp_tab_dev + rm_gpu_tab_index(g, il, 0, 0);
    const uint8_t * const * tab_gate = tab, * const * tab_up = tab + g->n_expert, * const * tab_down = tab + 2 * g->n_expert;
    uint8_t * td = sp->tab;
    cudaStream_t st = c->st;

    /* the GPU's base work, and the copies the host needs from it */
    CK(cudaMemcpyAsync(td, sp->tab_h, p.lay.end, cudaMemcpyHostToDevice, st), "split: tables");
    be->stats.h2d_bytes += p.lay.end;
    CK(rm_cu_gather_rows(st, sp->xc, a->xn, (const int32_t *) (td + p.lay.tok_of_row), S, E), "split: gather");
    if (host_work) {
        CK(cudaMemcpyAsync(sp->x_h, a->xn, f * (uint64_t) a->n_tok * (uint64_t) E, cudaMemcpyDeviceToHost, st), "split: input down");
        CK(cudaEventRecord(c->ev_x, st), "split: event");
        be->stats.d2h_bytes += f * (uint64_t) a->n_tok * (uint64_t) E;
        CK(cudaEventRecord(c->ev_t0[il], st), "split: event");
    }
    const rm_cu_group * groups_d = (const rm_cu_group *) (td + p.lay.groups);
    if (p.n_groups) {
        CK(rm_cu_matmul(st, L->gate_exps.type, E, F, L->gate_exps.row_bytes, NULL, tab_gate, groups_d, p.n_groups, p.max_c,
                        sp->xc, E, sp->gc, F, 0), "split: gate");
        CK(rm_cu_matmul(st, L->up_exps.type, E, F, L->up_exps.row_bytes, NULL, tab_up, groups_d, p.n_groups, p.max_c,
                        sp->xc, E, sp->uc, F, 0), "split: up");
    }
    const rm_weight * res[3] = {&L->gate_res, &L->up_res, &L->down_res};
    const uint8_t * staged[RM_CU_STAGE_EXPERTS][3];
    for (int k = 0; k < p.n_stage; k++) {    /* prefill: this expert's residual goes to the GPU */
        uint8_t * dst = sp->stage + (uint64_t) k * (sp->stage_bytes / RM_CU_STAGE_EXPERTS);
        for (int m = 0; m < 3; m++) {
            const uint64_t bytes = res[m]->row_bytes * (uint64_t) res[m]->ne[1];
            CK(cudaMemcpyAsync(dst, rm_weight_matrix(res[m], p.stage[k].mat), bytes, cudaMemcpyHostToDevice, st),
               "split: residual to the GPU");
            be->stats.h2d_bytes += bytes;
            be->stats.h2d_weight_bytes += bytes;
            staged[k][m] = dst;
            dst += bytes;
        }
        const int64_t r0 = p.stage[k].row0;
        CK(rm_cu_matmul(st, L->gate_res.type, E, F, L->gate_res.row_bytes, staged[k][0], NULL, NULL, 1, p.stage[k].n,
                        sp->xc + r0 * E, E, sp->gc + r0 * F, F, 1), "split: staged gate residual");
        CK(rm_cu_matmul(st, L->up_res.type, E, F, L->up_res.row_bytes, staged[k][1], NULL, NULL, 1, p.stage[k].n,
                        sp->xc + r0 * E, E, sp->uc + r0 * F, F, 1), "split: staged up residual");
    }
    if (p.n_fix) {
        const int32_t * fix_rows = (const int32_t *) (td + p.lay.fix_rows);
        CK(rm_cu_gather_rows(st, sp->gf, sp->gc, fix_rows, p.n_fix, F), "split: gather fix rows");
        CK(rm_cu_gather_rows(st, sp->uf, sp->uc, fix_rows, p.n_fix, F), "split: gather fix rows");
        CK(cudaMemcpyAsync(sp->gf_h, sp->gf, f * (uint64_t) p.n_fix * (uint64_t) F, cudaMemcpyDeviceToHost, st), "split: fix rows down");
        CK(cudaMemcpyAsync(sp->uf_h, sp->uf, f * (uint64_t) p.n_fix * (uint64_t) F, cudaMemcpyDeviceToHost, st), "split: fix rows down");
        CK(cudaEventRecord(c->ev_gu, st), "split: event");
        be->stats.d2h_bytes += 2 * f * (uint64_t) p.n_fix * (uint64_t) F;
    }
    CK(rm_cu_swiglu(st, sp->gc, sp->uc, (int64_t) S * F), "split: swiglu");
    if (p.n_groups) {
        CK(rm_cu_matmul(st, L->down_exps.type, F, E, L->down_exps.row_bytes, NULL, tab_down, groups_d, p.n_groups, p.max_c,
                        sp->gc, F, sp->dc, E, 0), "split: down");
    }
    for (int k = 0; k < p.n_stage; k++) {
        const int64_t r0 = p.stage[k].row0;
        CK(rm_cu_matmul(st, L->down_res.type, F, E, L->down_res.row_bytes, staged[k][2], NULL, NULL, 1, p.stage[k].n,
                        sp->gc + r0 * F, F, sp->dc + r0 * E, E, 1), "split: staged down residual");
    }
    CK(rm_cu_combine(st, a->out, sp->dc, (const int32_t *) (td + p.lay.slot_row), (const float *) (td + p.lay.w_gpu),
                     a->n_tok, K, E), "split: combine");
    if (!host_work) {
        return;
    }
    CK(cudaEventRecord(c->ev_t1[il], st), "split: event");

    /* the host's share, while the GPU runs the above */
    if (!rm_cuda_wait(be, c->ev_x, "split: waiting for the block input")) return;
    const rm_split_host hs = host_side(c);
    double t = now_us();
    rm_split_host_first(&hs, a, &p);
    double host_us = now_us() - t;
    if (p.n_fix) {
        if (!rm_cuda_wait(be, c->ev_gu, "split: waiting for the fix rows")) return;
        t = now_us();
        rm_split_host_second(&hs, a, &p);
        host_us += now_us() - t;
    }
    c->cpu_us[il] = (float) host_us;
    c->pending[il] = 1;
    be->stats.n_layer_steps++;
    be->stats.host_ms += host_us / 1000.0;

    /* the fix-up: h'.B_d for the fix rows, and the host results, into the sum */
    if (p.n_fix) {
        CK(cudaMemcpyAsync(sp->hf, sp->hf_h, f * (uint64_t) p.n_fix * (uint64_t) F, cudaMemcpyHostToDevice, st), "split: h' up");
        be->stats.h2d_bytes += f * (uint64_t) p.n_fix * (uint64_t) F;
        CK(rm_cu_matmul(st, L->down_exps.type, F, E, L->down_exps.row_bytes, NULL, tab_down,
                        (const rm_cu_group *) (td + p.lay.fix_groups), p.n_fix_groups, p.max_fix, sp->hf, F, sp->df, E, 0),
           "split: fix down");
        CK(rm_cu_combine(st, a->out, sp->df, (const int32_t *) (td + p.lay.fix_of_slot), (const float *) (td + p.lay.w_fix),
                         a->n_tok, K, E), "split: combine fix rows");
    }
    CK(cudaMemcpyAsync(sp->hr, sp->hr_h, f * (uint64_t) p.n_host_rows * (uint64_t) E, cudaMemcpyHostToDevice, st),
       "split: host results up");
    be->stats.h2d_bytes += f * (uint64_t) p.n_host_rows * (uint64_t) E;
    CK(rm_cu_combine(st, a->out, sp->hr, (const int32_t *) (td + p.lay.host_of_slot), (const float *) (td + p.lay.w_host),
                     a->n_tok, K, E), "split: combine host rows");
}
