/* split.c - the CPU/device split of a MoE block (split.h): the plan, the host's share, and the
 * sequence of a block that every device runs. */
#include "split.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devweights.h"
#include "sizes.h"

uint64_t rm_split_stage_bytes(const rm_model * m) {
    uint64_t most = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const rm_weight * r[3] = {&m->layers[il].gate_res, &m->layers[il].up_res, &m->layers[il].down_res};
        uint64_t b = 0;
        for (int k = 0; k < 3; k++) b += r[k]->row_bytes * (uint64_t) r[k]->ne[1];
        most = b > most ? b : most;
    }
    return rm_dev_round_up(most);
}

/* Slot s's place (rm_split_layout): its token's first place plus the number of the token's slots
 * whose experts come before its own (a token's experts are distinct). */
static int32_t place_of(const rm_moe_args * a, int32_t s) {
    const int32_t K = a->n_expert_used, t0 = s / K * K, e = a->routes_host[s].expert;
    int32_t before = 0;
    for (int32_t k = 0; k < K; k++) {
        before += a->routes_host[t0 + k].expert < e;
    }
    return t0 + before;
}

void rm_split_make_plan(const rm_moe_args * a, const uint8_t * const * exp_tab, int can_stage,
                        int32_t upload_min_tokens, uint8_t * t, int32_t * host_groups, rm_split_plan * p) {
    const int32_t K = a->n_expert_used, S = a->n_tok * K, X = a->n_expert;
    memset(p, 0, sizeof(*p));
    p->lay = rm_split_layout_for(S);
    p->groups = (rm_split_group *) (t + p->lay.groups);
    p->fix_groups = (rm_split_group *) (t + p->lay.fix_groups);
    p->tok_of_row = (int32_t *) (t + p->lay.tok_of_row);
    p->slot_row = (int32_t *) (t + p->lay.slot_row);
    p->fix_of_slot = (int32_t *) (t + p->lay.fix_of_slot);
    p->host_of_slot = (int32_t *) (t + p->lay.host_of_slot);
    p->fix_rows = (int32_t *) (t + p->lay.fix_rows);
    p->w = (float *) (t + p->lay.w);
    p->host_groups = host_groups;
    for (int32_t s = 0; s < S; s++) {
        p->slot_row[s] = p->fix_of_slot[s] = p->host_of_slot[s] = -1;
    }
    /* slots by place (rm_split_layout): the weights go to their places here, the rows below */
    for (int32_t s = 0; s < S; s++) {
        p->w[place_of(a, s)] = a->routes_host[s].weight;
    }
    can_stage = can_stage && upload_min_tokens > 0;
    int32_t row = 0;
    for (int32_t e = 0; e < X; e++) {
        const int32_t cnt = a->exp_n_host[e];
        if (cnt == 0) {
            continue;
        }
        const int32_t * pairs = a->exp_pairs_host + (int64_t) e * a->cap;
        int32_t c_res = 0;
        for (int32_t j = 0; j < cnt; j++) {
            p->tok_of_row[row + j] = pairs[j] / K;
            c_res += a->routes_host[pairs[j]].residual;
        }
        const int on_dev = exp_tab[rm_dev_expert_index(X, a->layer, RM_EXP_GATE, e)] &&
                           exp_tab[rm_dev_expert_index(X, a->layer, RM_EXP_UP, e)] &&
                           exp_tab[rm_dev_expert_index(X, a->layer, RM_EXP_DOWN, e)];
        if (!on_dev) {
            int32_t * hg = host_groups + 4 * p->n_host_groups++;
            hg[0] = e, hg[1] = row, hg[2] = cnt, hg[3] = c_res;
            row += cnt;
            continue;
        }
        p->groups[p->n_groups++] = (rm_split_group) {e, row, cnt};
        p->max_c = cnt > p->max_c ? cnt : p->max_c;
        const int staged = can_stage && c_res > 0 && c_res >= upload_min_tokens && p->n_stage < RM_SPLIT_STAGE_MAX;
        if (staged) {
            p->stage[p->n_stage++] = (rm_split_group) {e, row, c_res};
        }
        const int32_t fix0 = p->n_fix;
        for (int32_t j = 0; j < cnt; j++) {
            const int32_t s = place_of(a, pairs[j]);
            if (j < c_res && !staged) {
                p->fix_of_slot[s] = p->n_fix;
                p->host_of_slot[s] = p->n_fix;   /* its h'.R_d comes back as a host row */
                p->fix_rows[p->n_fix++] = row + j;
            } else {
                p->slot_row[s] = row + j;
            }
        }
        if (p->n_fix > fix0) {
            p->fix_groups[p->n_fix_groups++] = (rm_split_group) {e, fix0, p->n_fix - fix0};
            p->max_fix = p->n_fix - fix0 > p->max_fix ? p->n_fix - fix0 : p->max_fix;
        }
        row += cnt;
    }
    /* host experts' rows come after the fix rows in the host buffers */
    p->n_host_rows = p->n_fix;
    for (int32_t h = 0; h < p->n_host_groups; h++) {
        const int32_t * hg = host_groups + 4 * h;
        const int32_t * pairs = a->exp_pairs_host + (int64_t) hg[0] * a->cap;
        for (int32_t j = 0; j < hg[2]; j++) {
            p->host_of_slot[place_of(a, pairs[j])] = p->n_host_rows++;
        }
    }
}

static void host_mm(rm_backend * cpu, const rm_weight * w, int32_t e, const float * x, int64_t xs, int32_t n, float * y,
                    int64_t ys, int acc) {
    rm_matmul_args m = {w, e, x, xs, n, y, ys, acc};
    cpu->ops->matmul(cpu, &m);
}

void rm_split_host_first(const rm_split_host * h, const rm_moe_args * a, const rm_split_plan * p) {
    const rm_layer * L = a->L;
    const int64_t E = a->n_embd, F = a->n_ff;
    for (int32_t j = 0; j < p->n_fix; j++) {
        memcpy(h->xs + j * E, h->x + (int64_t) p->tok_of_row[p->fix_rows[j]] * E, sizeof(float) * (size_t) E);
    }
    for (int32_t k = 0; k < p->n_fix_groups; k++) {
        const rm_split_group * fg = &p->fix_groups[k];
        host_mm(h->cpu, &L->gate_res, fg->mat, h->xs + fg->row0 * E, E, fg->n, h->gs + fg->row0 * F, F, 0);
        host_mm(h->cpu, &L->up_res, fg->mat, h->xs + fg->row0 * E, E, fg->n, h->us + fg->row0 * F, F, 0);
    }
    int32_t r = p->n_fix;
    for (int32_t k = 0; k < p->n_host_groups; k++) {
        const int32_t * hg = p->host_groups + 4 * k;
        const int32_t e = hg[0], row0 = hg[1], cnt = hg[2], c_res = hg[3];
        for (int32_t j = 0; j < cnt; j++) {
            memcpy(h->xs + (r + j) * E, h->x + (int64_t) p->tok_of_row[row0 + j] * E, sizeof(float) * (size_t) E);
        }
        float * x = h->xs + r * E, * gg = h->gs + r * F, * uu = h->us + r * F, * d = h->hr + r * E;
        host_mm(h->cpu, &L->gate_exps, e, x, E, cnt, gg, F, 0);
        host_mm(h->cpu, &L->up_exps, e, x, E, cnt, uu, F, 0);
        if (c_res > 0) {
            host_mm(h->cpu, &L->gate_res, e, x, E, c_res, gg, F, 1);
            host_mm(h->cpu, &L->up_res, e, x, E, c_res, uu, F, 1);
        }
        rm_expert_bias(h->cpu, &L->gate_exps_b, e, gg, cnt);
        rm_expert_bias(h->cpu, &L->up_exps_b, e, uu, cnt);
        rm_expert_act(h->cpu, L, gg, uu, (int64_t) cnt * F);
        host_mm(h->cpu, &L->down_exps, e, gg, F, cnt, d, E, 0);
        if (c_res > 0) {
            host_mm(h->cpu, &L->down_res, e, gg, F, c_res, d, E, 1);
        }
        rm_expert_bias(h->cpu, &L->down_exps_b, e, d, cnt);
        r += cnt;
    }
}

void rm_split_host_second(const rm_split_host * h, const rm_moe_args * a, const rm_split_plan * p) {
    const int64_t E = a->n_embd, F = a->n_ff;
    /* the clamped forms: base and residual summed (gpt-oss's g_B and u_B came down with their
     * biases), then the layer's activation */
    if ((a->L->kind & RM_LAYER_SWIGLU_CLAMP) || a->L->ffn_limit > 0.0f) {
        for (int64_t j = 0; j < (int64_t) p->n_fix * F; j++) {
            h->hf[j] = h->gf[j] + h->gs[j];
            h->us[j] += h->uf[j];
        }
        rm_expert_act(h->cpu, a->L, h->hf, h->us, (int64_t) p->n_fix * F);
    } else {
        for (int64_t j = 0; j < (int64_t) p->n_fix * F; j++) {
            const float gv = h->gf[j] + h->gs[j], uv = h->uf[j] + h->us[j];
            h->hf[j] = gv / (1.0f + expf(-gv)) * uv;
        }
    }
    for (int32_t k = 0; k < p->n_fix_groups; k++) {
        const rm_split_group * fg = &p->fix_groups[k];
        host_mm(h->cpu, &a->L->down_res, fg->mat, h->hf + fg->row0 * F, F, fg->n, h->hr + fg->row0 * E, E, 0);
    }
}

/* ---- one block, for every device ---------------------------------------------------------- */

int rm_split_init(rm_backend * be, rm_split_state * sp, const rm_model * m, int32_t n_batch) {
    const rm_split_device_ops * d = sp->dev;
    const rm_hparams * hp = &m->hp;
    sp->max_slots = (int64_t) n_batch * hp->n_expert_used;
    const uint64_t S = (uint64_t) sp->max_slots, E = (uint64_t) hp->n_embd, F = (uint64_t) hp->n_ff_exp;
    const uint64_t f = sizeof(float);
    /* the device buffers' sizes (sizes.h): xc .. hr, then the plan table */
    const int stage = sp->upload_min_tokens > 0 && m->residual;   /* residual copies in prefill */
    const rm_size_params p = rm_size_params_of(hp, 0, n_batch, stage ? rm_split_stage_bytes(m) : 0);
    uint64_t all[RM_SPLIT_BUF_COUNT];
    rm_split_buf_bytes(&p, all);
    _Static_assert(RM_SPLIT_BUF_TAB - RM_SPLIT_BUF_XC == 9 && RM_SPLIT_BUF_TAB + 1 == RM_SPLIT_BUF_COUNT,
                   "rm_split_init: xc .. hr and the table are the last ten split buffers");
    const uint64_t * sizes = all + RM_SPLIT_BUF_XC;
    memcpy(sp->dev_bytes, sizes, sizeof(sp->dev_bytes));
    float ** bufs[9] = {&sp->xc, &sp->gc, &sp->uc, &sp->dc, &sp->gf, &sp->uf, &sp->hf, &sp->df, &sp->hr};
    for (int i = 0; i < 9; i++) {
        if (!(*bufs[i] = d->dev_alloc(be, sizes[i]))) return 0;
    }
    if (!(sp->tab = d->dev_alloc(be, sizes[9]))) return 0;
    if (stage) {
        sp->stage_bytes = rm_split_stage_buf_bytes(&p);
        if (!(sp->stage = d->dev_alloc(be, sp->stage_bytes))) return 0;
    }
    if (!(sp->tab_h = d->host_alloc(be, sizes[9])) || !(sp->x_h = d->host_alloc(be, f * (uint64_t) n_batch * E)) ||
        !(sp->gf_h = d->host_alloc(be, f * S * F)) || !(sp->uf_h = d->host_alloc(be, f * S * F)) ||
        !(sp->hf_h = d->host_alloc(be, f * S * F)) || !(sp->hr_h = d->host_alloc(be, f * S * E))) {
        return 0;
    }
    sp->xs = malloc(f * S * E);
    sp->gs = malloc(f * S * F);
    sp->us = malloc(f * S * F);
    sp->host_groups = malloc(sizeof(int32_t) * 4 * (size_t) hp->n_expert);
    if (!sp->xs || !sp->gs || !sp->us || !sp->host_groups) {
        char msg[128];
        snprintf(msg, sizeof(msg), "%s: out of host memory for the split's scratch", sp->who);
        return d->fail(be, RM_E_OOM, msg);
    }
    return 1;
}

void rm_split_free(rm_backend * be, rm_split_state * sp) {
    const rm_split_device_ops * d = sp->dev;
    float * bufs[9] = {sp->xc, sp->gc, sp->uc, sp->dc, sp->gf, sp->uf, sp->hf, sp->df, sp->hr};
    for (int i = 0; i < 9; i++) {
        if (bufs[i]) d->dev_free(be, bufs[i], sp->dev_bytes[i]);
    }
    if (sp->tab) d->dev_free(be, sp->tab, sp->dev_bytes[9]);
    if (sp->stage) d->dev_free(be, sp->stage, sp->stage_bytes);
    void * pins[6] = {sp->tab_h, sp->x_h, sp->gf_h, sp->uf_h, sp->hf_h, sp->hr_h};
    for (int i = 0; i < 6; i++) {
        if (pins[i]) d->host_free(be, pins[i]);
    }
    free(sp->xs);
    free(sp->gs);
    free(sp->us);
    free(sp->host_groups);
    sp->xc = sp->gc = sp->uc = sp->dc = sp->gf = sp->uf = sp->hf = sp->df = sp->hr = NULL;
    sp->tab = sp->stage = sp->tab_h = NULL;
    sp->x_h = sp->gf_h = sp->uf_h = sp->hf_h = sp->hr_h = sp->xs = sp->gs = sp->us = NULL;
    sp->host_groups = NULL;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e6 + (double) ts.tv_nsec * 1e-3;
}

#define RM_STEP(call) if (!(call)) return

void rm_split_run(rm_backend * be, rm_split_state * sp, const rm_moe_args * a) {
    const rm_split_device_ops * d = sp->dev;
    const rm_layer * L = a->L;
    const int il = a->layer;
    const int32_t K = a->n_expert_used, S = a->n_tok * K;
    const int64_t E = a->n_embd, F = a->n_ff;
    const uint64_t f = sizeof(float);
    be->layer_cpu_us[il] = be->layer_gpu_us[il] = 0.0f;
    if (d->has_error(be) || S <= 0) return;
    if (S > sp->max_slots) {
        char msg[160];
        snprintf(msg, sizeof(msg), "%s: %d slots exceed the split's %lld", sp->who, S, (long long) sp->max_slots);
        d->fail(be, RM_E_INTERNAL, msg);
        return;
    }
    rm_split_plan p;
    const int can_stage = sp->stage && d->can_stage(be, L);
    rm_split_make_plan(a, sp->exp_tab, can_stage, sp->upload_min_tokens, sp->tab_h, sp->host_groups, &p);
    const int host_work = p.n_host_rows > 0;   /* fix rows and host experts' rows */
    uint8_t * td = sp->tab;

    /* the device's base work, and the copies the host needs from it */
    RM_STEP(d->upload(be, td, sp->tab_h, p.lay.end, "split: tables"));
    be->stats.h2d_bytes += p.lay.end;
    RM_STEP(d->gather(be, sp->xc, a->xn, (const int32_t *) (td + p.lay.tok_of_row), S, E, "split: gather"));
    if (host_work) {
        RM_STEP(d->download(be, sp->x_h, a->xn, f * (uint64_t) a->n_tok * (uint64_t) E, "split: input down"));
        RM_STEP(d->record(be, RM_SPLIT_EV_INPUT, il, "split: event"));
        be->stats.d2h_bytes += f * (uint64_t) a->n_tok * (uint64_t) E;
        RM_STEP(d->record(be, RM_SPLIT_EV_BASE0, il, "split: event"));
    }
    const rm_split_group * groups_d = (const rm_split_group *) (td + p.lay.groups);
    if (p.n_groups) {
        RM_STEP(d->experts_matmul(be, &L->gate_exps, il, RM_EXP_GATE, E, F, groups_d, p.n_groups, p.max_c, sp->xc, E,
                                  sp->gc, F, "split: gate"));
        RM_STEP(d->experts_matmul(be, &L->up_exps, il, RM_EXP_UP, E, F, groups_d, p.n_groups, p.max_c, sp->xc, E,
                                  sp->uc, F, "split: up"));
    }
    const rm_weight * res[3] = {&L->gate_res, &L->up_res, &L->down_res};
    const uint8_t * staged[RM_SPLIT_STAGE_MAX][3];
    for (int k = 0; k < p.n_stage; k++) {    /* prefill: this expert's residual goes to the device */
        uint8_t * dst = sp->stage + (uint64_t) k * (sp->stage_bytes / RM_SPLIT_STAGE_MAX);
        for (int m = 0; m < 3; m++) {
            const uint64_t bytes = res[m]->row_bytes * (uint64_t) res[m]->ne[1];
            RM_STEP(d->upload(be, dst, rm_weight_matrix(res[m], p.stage[k].mat), bytes, "split: residual to the GPU"));
            be->stats.h2d_bytes += bytes;
            be->stats.h2d_weight_bytes += bytes;
            staged[k][m] = dst;
            dst += bytes;
        }
        const int64_t r0 = p.stage[k].row0;
        RM_STEP(d->staged_matmul(be, &L->gate_res, staged[k][0], E, F, p.stage[k].n, sp->xc + r0 * E, E,
                                 sp->gc + r0 * F, F, "split: staged gate residual"));
        RM_STEP(d->staged_matmul(be, &L->up_res, staged[k][1], E, F, p.stage[k].n, sp->xc + r0 * E, E,
                                 sp->uc + r0 * F, F, "split: staged up residual"));
    }
    if (p.n_groups && L->gate_exps_b.data) {   /* gpt-oss: once, after base + staged residual */
        RM_STEP(d->experts_bias(be, &L->gate_exps_b, groups_d, p.n_groups, p.max_c, sp->gc, F, "split: gate bias"));
        RM_STEP(d->experts_bias(be, &L->up_exps_b, groups_d, p.n_groups, p.max_c, sp->uc, F, "split: up bias"));
    }
    if (p.n_fix) {
        const int32_t * fix_rows = (const int32_t *) (td + p.lay.fix_rows);
        const uint64_t bytes = f * (uint64_t) p.n_fix * (uint64_t) F;
        RM_STEP(d->gather(be, sp->gf, sp->gc, fix_rows, p.n_fix, F, "split: gather fix rows"));
        RM_STEP(d->gather(be, sp->uf, sp->uc, fix_rows, p.n_fix, F, "split: gather fix rows"));
        RM_STEP(d->download(be, sp->gf_h, sp->gf, bytes, "split: fix rows down"));
        RM_STEP(d->download(be, sp->uf_h, sp->uf, bytes, "split: fix rows down"));
        RM_STEP(d->record(be, RM_SPLIT_EV_FIX, il, "split: event"));
        be->stats.d2h_bytes += 2 * bytes;
    }
    if (L->kind & RM_LAYER_GELU) {
        RM_STEP(d->geglu(be, sp->gc, sp->uc, (int64_t) S * F, "split: geglu"));
    } else if (L->kind & RM_LAYER_SWIGLU_CLAMP) {
        RM_STEP(d->swiglu_clamp(be, sp->gc, sp->uc, (int64_t) S * F, RM_SWIGLU_OAI_ALPHA, RM_SWIGLU_OAI_LIMIT,
                                "split: swiglu"));
    } else if (L->ffn_limit > 0.0f) {
        RM_STEP(d->swiglu_clamp(be, sp->gc, sp->uc, (int64_t) S * F, L->ffn_limit_alpha, L->ffn_limit, "split: swiglu"));
    } else {
        RM_STEP(d->swiglu(be, sp->gc, sp->uc, (int64_t) S * F, "split: swiglu"));
    }
    if (p.n_groups) {
        RM_STEP(d->experts_matmul(be, &L->down_exps, il, RM_EXP_DOWN, F, E, groups_d, p.n_groups, p.max_c, sp->gc, F,
                                  sp->dc, E, "split: down"));
    }
    for (int k = 0; k < p.n_stage; k++) {
        const int64_t r0 = p.stage[k].row0;
        RM_STEP(d->staged_matmul(be, &L->down_res, staged[k][2], F, E, p.stage[k].n, sp->gc + r0 * F, F,
                                 sp->dc + r0 * E, E, "split: staged down residual"));
    }
    if (p.n_groups && L->down_exps_b.data) {
        RM_STEP(d->experts_bias(be, &L->down_exps_b, groups_d, p.n_groups, p.max_c, sp->dc, E, "split: down bias"));
    }
    /* one weighted sum of every slot, in the CPU backend's order (rm_split_layout) */
    const int32_t * dev_row = (const int32_t *) (td + p.lay.slot_row), * fix_row = (const int32_t *) (td + p.lay.fix_of_slot);
    const int32_t * host_row = (const int32_t *) (td + p.lay.host_of_slot);
    const float * w = (const float *) (td + p.lay.w);
    if (!host_work) {
        RM_STEP(d->combine(be, a->out, sp->dc, sp->df, sp->hr, dev_row, fix_row, host_row, w, a->n_tok, K, E, "split: combine"));
        return;
    }
    RM_STEP(d->record(be, RM_SPLIT_EV_BASE1, il, "split: event"));

    /* the host's share, while the device runs the above */
    be->stats.n_syncs++;
    RM_STEP(d->wait(be, RM_SPLIT_EV_INPUT, "split: waiting for the block input"));
    const rm_split_host hs = {sp->host, sp->x_h, sp->xs, sp->gs, sp->us, sp->gf_h, sp->uf_h, sp->hf_h, sp->hr_h};
    double t = now_us();
    rm_split_host_first(&hs, a, &p);
    double host_us = now_us() - t;
    if (p.n_fix) {
        be->stats.n_syncs++;
        RM_STEP(d->wait(be, RM_SPLIT_EV_FIX, "split: waiting for the fix rows"));
        t = now_us();
        rm_split_host_second(&hs, a, &p);
        host_us += now_us() - t;
    }
    be->layer_cpu_us[il] = (float) host_us;
    be->stats.n_layer_steps++;
    be->stats.host_ms += host_us / 1000.0;
    d->layer_timed(be, il, host_us);

    /* the fix-up: h'.B_d for the fix rows, and the host results, into the sum */
    if (p.n_fix) {
        const uint64_t bytes = f * (uint64_t) p.n_fix * (uint64_t) F;
        RM_STEP(d->upload(be, sp->hf, sp->hf_h, bytes, "split: h' up"));
        be->stats.h2d_bytes += bytes;
        RM_STEP(d->experts_matmul(be, &L->down_exps, il, RM_EXP_DOWN, F, E,
                                  (const rm_split_group *) (td + p.lay.fix_groups), p.n_fix_groups, p.max_fix, sp->hf, F,
                                  sp->df, E, "split: fix down"));
        if (L->down_exps_b.data) {
            RM_STEP(d->experts_bias(be, &L->down_exps_b, (const rm_split_group *) (td + p.lay.fix_groups),
                                    p.n_fix_groups, p.max_fix, sp->df, E, "split: fix down bias"));
        }
    }
    const uint64_t bytes = f * (uint64_t) p.n_host_rows * (uint64_t) E;
    RM_STEP(d->upload(be, sp->hr, sp->hr_h, bytes, "split: host results up"));
    be->stats.h2d_bytes += bytes;
    RM_STEP(d->combine(be, a->out, sp->dc, sp->df, sp->hr, dev_row, fix_row, host_row, w, a->n_tok, K, E, "split: combine"));
}

#undef RM_STEP
