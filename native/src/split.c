/* split.c - the host side of the CPU/device split of a MoE block (split.h). */
#include "split.h"

#include <math.h>
#include <string.h>

#include "devweights.h"

rm_split_layout rm_split_layout_for(int64_t S) {
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
    RM_TAKE(w_gpu, i);
    RM_TAKE(w_fix, i);
    RM_TAKE(w_host, i);
#undef RM_TAKE
    l.end = o;
    return l;
}

uint64_t rm_split_stage_bytes(const rm_model * m) {
    uint64_t most = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const rm_weight * r[3] = {&m->layers[il].gate_res, &m->layers[il].up_res, &m->layers[il].down_res};
        uint64_t b = 0;
        for (int k = 0; k < 3; k++) b += r[k]->row_bytes * (uint64_t) r[k]->ne[1];
        most = b > most ? b : most;
    }
    return (most + 255) / 256 * 256;
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
    p->w_gpu = (float *) (t + p->lay.w_gpu);
    p->w_fix = (float *) (t + p->lay.w_fix);
    p->w_host = (float *) (t + p->lay.w_host);
    p->host_groups = host_groups;
    for (int32_t s = 0; s < S; s++) {
        p->slot_row[s] = p->fix_of_slot[s] = p->host_of_slot[s] = -1;
        p->w_gpu[s] = p->w_fix[s] = p->w_host[s] = 0.0f;
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
            const int32_t s = pairs[j];
            const float w = a->routes_host[s].weight;
            if (j < c_res && !staged) {
                p->fix_of_slot[s] = p->n_fix;
                p->w_fix[s] = w;
                p->host_of_slot[s] = p->n_fix;   /* its h'.R_d comes back as a host row */
                p->w_host[s] = w;
                p->fix_rows[p->n_fix++] = row + j;
            } else {
                p->slot_row[s] = row + j;
                p->w_gpu[s] = w;
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
            p->host_of_slot[pairs[j]] = p->n_host_rows++;
            p->w_host[pairs[j]] = a->routes_host[pairs[j]].weight;
        }
    }
}

static void host_mm(rm_backend * cpu, const rm_weight * w, int32_t e, const float * x, int64_t xs, int32_t n, float * y,
                    int64_t ys, int acc) {
    rm_matmul_args m = {w, e, x, xs, n, y, ys, acc};
    cpu->matmul(cpu, &m);
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
        h->cpu->swiglu(h->cpu, gg, uu, (int64_t) cnt * F);
        host_mm(h->cpu, &L->down_exps, e, gg, F, cnt, d, E, 0);
        if (c_res > 0) {
            host_mm(h->cpu, &L->down_res, e, gg, F, c_res, d, E, 1);
        }
        r += cnt;
    }
}

void rm_split_host_second(const rm_split_host * h, const rm_moe_args * a, const rm_split_plan * p) {
    const int64_t E = a->n_embd, F = a->n_ff;
    for (int64_t j = 0; j < (int64_t) p->n_fix * F; j++) {
        const float gv = h->gf[j] + h->gs[j], uv = h->uf[j] + h->us[j];
        h->hf[j] = gv / (1.0f + expf(-gv)) * uv;
    }
    for (int32_t k = 0; k < p->n_fix_groups; k++) {
        const rm_split_group * fg = &p->fix_groups[k];
        host_mm(h->cpu, &a->L->down_res, fg->mat, h->hf + fg->row0 * F, F, fg->n, h->hr + fg->row0 * E, E, 0);
    }
}
