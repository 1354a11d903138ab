/* devweights.c - which weights a device holds, and where (devweights.h). */
#include "devweights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

void rm_dev_format_bytes(char * buf, size_t cap, uint64_t b) {
    if (b >= (1ull << 30)) {
        snprintf(buf, cap, "%.2f GiB", (double) b / (1ull << 30));
    } else if (b >= (1ull << 20)) {
        snprintf(buf, cap, "%.1f MiB", (double) b / (1ull << 20));
    } else {
        snprintf(buf, cap, "%.1f KiB", (double) b / (1ull << 10));
    }
}

void rm_dev_budget_error(const char * what, uint64_t bytes, uint64_t held, uint64_t budget) {
    char want[32], used[32], cap[32];
    rm_dev_format_bytes(want, sizeof(want), bytes);
    rm_dev_format_bytes(used, sizeof(used), held);
    rm_dev_format_bytes(cap, sizeof(cap), budget);
    rm_fail(RM_E_OOM, "%s: %s more device memory would exceed the budget (%s held of %s); lower n_ctx or n_batch, "
            "or keep more experts on the CPU (rapidmoe plan)", what, want, used, cap);
}

static int push(rm_dev_weights * w, int64_t * cap, const uint8_t * host, uint64_t bytes) {
    if (!host || bytes == 0) {
        return 1;
    }
    if (w->n_ranges == *cap) {
        const int64_t n = *cap ? 2 * *cap : 256;
        rm_dev_range * r = (rm_dev_range *) realloc(w->ranges, sizeof(*r) * (size_t) n);
        if (!r) {
            return 0;
        }
        w->ranges = r;
        *cap = n;
    }
    rm_dev_range * r = &w->ranges[w->n_ranges++];
    r->host = host;
    r->bytes = bytes;
    r->dev = NULL;
    r->offset = 0;
    return 1;
}

static uint64_t matrix_bytes(const rm_weight * t) { return t->row_bytes * (uint64_t) t->ne[1]; }

/* A dense tensor: F32 vectors always (the small ops need them), matrices of supported types. */
static int push_dense(rm_dev_weights * w, int64_t * cap, const rm_weight * t, rm_dev_supports_fn supports) {
    if (!t->data) {
        return 1;
    }
    const int is_vector = t->ne[1] == 1 && t->type == RM_TYPE_F32;
    if (!is_vector && supports && !supports(t->type, t->ne[0])) {
        w->n_skipped++;
        return 1;
    }
    return push(w, cap, t->data, matrix_bytes(t) * (uint64_t) t->ne[2]);
}

static int by_host(const void * a, const void * b) {
    const uint8_t * x = ((const rm_dev_range *) a)->host, * y = ((const rm_dev_range *) b)->host;
    return x < y ? -1 : x > y;
}

int rm_dev_weights_list(const rm_model * m, const uint8_t * on_dev, rm_dev_supports_fn supports, rm_dev_weights * w) {
    const rm_hparams * hp = &m->hp;
    w->ranges = NULL;
    w->n_ranges = 0;
    w->bytes = 0;
    w->n_skipped = 0;
    w->arena = NULL;
    int64_t cap = 0;
    int ok = push_dense(w, &cap, &m->output_norm, supports) && push_dense(w, &cap, &m->output, supports) &&
             push_dense(w, &cap, &m->rope_freqs, supports);
    for (int il = 0; ok && il < hp->n_layer; il++) {
        const rm_layer * L = &m->layers[il];
        for (int32_t i = 0; ok && i < m->arch->n_tensors; i++) {   /* every tensor of the layer but the experts' */
            const rm_tensor_row * t = &m->arch->tensors[i];
            if (!t->expert && rm_layer_kind_has(L->kind, t->when)) {
                /* the conv filters are read by the gdn op as they are, not by a product: any backend holds them */
                const int direct = t->field && strcmp(t->field, "ssm_conv1d") == 0;
                ok = push_dense(w, &cap, (const rm_weight *) ((const char *) L + t->off), direct ? NULL : supports);
            }
        }
        const rm_weight * exps[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        int types_ok = 1;
        for (int k = 0; k < 3 && supports; k++) {
            types_ok &= supports(exps[k]->type, exps[k]->ne[0]) != 0;
        }
        for (int e = 0; ok && e < hp->n_expert; e++) {
            if (on_dev && !on_dev[(int64_t) il * hp->n_expert + e]) {
                continue;
            }
            if (!types_ok) {
                w->n_skipped++;
                continue;
            }
            for (int k = 0; ok && k < 3; k++) {
                ok = push(w, &cap, rm_weight_matrix(exps[k], e), matrix_bytes(exps[k]));
            }
        }
    }
    if (!ok) {
        rm_dev_weights_free(w);
        return 0;
    }
    rm_dev_weights_sort(w);
    int64_t n = 0;
    for (int64_t i = 0; i < w->n_ranges; i++) {
        if (n == 0 || w->ranges[i].host != w->ranges[n - 1].host) {
            w->ranges[n] = w->ranges[i];
            w->ranges[n].offset = w->bytes;
            w->bytes += rm_dev_round_up(w->ranges[n].bytes);
            n++;
        }
    }
    w->n_ranges = n;
    return 1;
}

void rm_dev_weights_sort(rm_dev_weights * w) {
    qsort(w->ranges, (size_t) w->n_ranges, sizeof(*w->ranges), by_host);
}

void rm_dev_weights_place(rm_dev_weights * w, uint8_t * arena) {
    w->arena = arena;
    for (int64_t i = 0; i < w->n_ranges; i++) {
        w->ranges[i].dev = arena + w->ranges[i].offset;
    }
}

const uint8_t * rm_dev_weights_find(const rm_dev_weights * w, const uint8_t * host) {
    int64_t lo = 0, hi = w->n_ranges;   /* the last range starting at or before host */
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (w->ranges[mid].host <= host) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo == 0) {
        return NULL;
    }
    const rm_dev_range * r = &w->ranges[lo - 1];
    return host < r->host + r->bytes && r->dev ? r->dev + (host - r->host) : NULL;
}

int32_t rm_dev_expert_table(const rm_dev_weights * w, const rm_model * m, const uint8_t ** tab) {
    const int32_t X = m->hp.n_expert;
    int32_t whole = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const rm_layer * L = &m->layers[il];
        const rm_weight * exps[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int e = 0; e < X; e++) {
            int all = 1;
            for (int k = 0; k < 3; k++) {
                const uint8_t * d = rm_dev_weights_find(w, rm_weight_matrix(exps[k], e));
                tab[rm_dev_expert_index(X, il, k, e)] = d;
                all &= d != NULL;
            }
            whole += all;
        }
    }
    return whole;
}

void rm_dev_weights_free(rm_dev_weights * w) {
    free(w->ranges);
    w->ranges = NULL;
    w->n_ranges = 0;
}
