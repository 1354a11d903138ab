/* batch.c - several sequences in one evaluation (rm_batch_eval).
 *
 * The tokens of a batch are grouped by session (each session's in batch order) and cut into
 * steps of at most the first session's n_batch rows; each step is one forward pass on that
 * session's scratch (rm_session_forward) with one run per sequence, so every weight matrix, and
 * in the MoE block every routed expert, is read once per step for all the sequences, while
 * attention (plain, multi-head latent, or a linear layer's recurrence) and the residual policy
 * follow each run's own session. */
#include <stdlib.h>
#include <string.h>

#include "deltanet.h"
#include "policy.h"
#include "session.h"
#include "status.h"

/* Everything that can be refused before a cache changes; next[j]: session j's n_past after the batch. */
static rm_status check_batch(const rm_batch * b, int32_t * next, int32_t * n_out) {
    rm_session * const * ss = b->sessions;
    const rm_model * m = ss[0]->m;
    for (int32_t j = 0; j < b->n_sessions; j++) {
        const rm_session * s = ss[j];
        if (!s) return rm_fail(RM_E_INVALID_ARG, "rm_batch_eval: sessions[%d] is NULL", j);
        if (s->m != m) return rm_fail(RM_E_INVALID_ARG, "rm_batch_eval: sessions[%d] belongs to another model", j);
        for (int32_t i = 0; i < j; i++) {
            if (ss[i] == s) return rm_fail(RM_E_INVALID_ARG, "rm_batch_eval: sessions[%d] and [%d] are the same session", i, j);
        }
        if (strcmp(s->be->ops->name, ss[0]->be->ops->name) != 0) {   /* one step runs on sessions[0]'s backend */
            return rm_fail(RM_E_INVALID_ARG, "rm_batch_eval: sessions[%d] runs on the %s backend and sessions[0] on the "
                           "%s one; a batch's sessions share one", j, s->be->ops->name, ss[0]->be->ops->name);
        }
        if (s->calibrating) return rm_fail(RM_E_STATE, "rm_batch_eval: sessions[%d] is calibrating", j);
        if (s->imp_in) return rm_fail(RM_E_STATE, "rm_batch_eval: sessions[%d] is collecting importance", j);
        if (s->n_ctx > ss[0]->n_ctx) {   /* the batch runs on sessions[0]'s scratch, sized for its context */
            return rm_fail(RM_E_INVALID_ARG, "rm_batch_eval: sessions[%d] has a context of %d, above sessions[0]'s %d; "
                           "put the session with the largest context first", j, s->n_ctx, ss[0]->n_ctx);
        }
        const rm_status st = s->be->ops->status(s->be);
        if (st != RM_OK) return rm_fail(st, "rm_batch_eval: sessions[%d]'s backend failed earlier: %s", j, rm_last_error());
        next[j] = s->n_past;
    }
    *n_out = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        const int32_t j = b->seq[i];
        if (j < 0 || j >= b->n_sessions) {
            return rm_fail(RM_E_INVALID_ARG, "rm_batch_eval: token %d: seq %d outside [0, %d)", i, j, b->n_sessions);
        }
        if (b->tokens[i] < 0 || b->tokens[i] >= m->hp.n_vocab) {
            return rm_fail(RM_E_INVALID_ARG, "rm_batch_eval: token %d at index %d is outside the vocabulary [0, %d)",
                           b->tokens[i], i, m->hp.n_vocab);
        }
        if (b->pos && b->pos[i] != next[j]) {
            return rm_fail(RM_E_INVALID_ARG, "rm_batch_eval: token %d of sessions[%d] at position %d; its next position is %d",
                           i, j, b->pos[i], next[j]);
        }
        if (++next[j] > ss[j]->n_ctx) {
            return rm_fail(RM_E_CONTEXT_FULL, "rm_batch_eval: sessions[%d]'s tokens exceed its context of %d", j, ss[j]->n_ctx);
        }
        *n_out += b->logits && b->logits[i];
    }
    const uint64_t need = (uint64_t) *n_out * (uint64_t) m->hp.n_vocab;
    if (need > 0 && (!b->out || b->out_cap < need)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_batch_eval: out holds %llu floats, %llu needed for %d rows of logits",
                       (unsigned long long) (b->out ? b->out_cap : 0), (unsigned long long) need, *n_out);
    }
    return RM_OK;
}

/* The batch order grouped by session, the sessions with one token first (decoding: multi-head
 * latent attention runs consecutive single tokens together), then the others, each group in
 * session order: order[k] is the k-th token to run; dst[i]: token i's row of out (or -1).
 * count[j]: session j's tokens; first: n_sessions entries of scratch. */
static void group_by_session(const rm_batch * b, const int32_t * count, int32_t * order, int32_t * dst, int32_t * first) {
    int32_t at = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t j = 0; j < b->n_sessions; j++) {
            if ((count[j] == 1) == (pass == 0)) {
                first[j] = at;
                at += count[j];
            }
        }
    }
    int32_t row = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        order[first[b->seq[i]]++] = i;
        dst[i] = b->logits && b->logits[i] ? row++ : -1;
    }
}

typedef struct step {
    rm_seq_run * runs;            /* n_sessions */
    int32_t *    tokens, * rows;  /* n_batch: the step's tokens, its rows that want logits */
    int32_t *    dst;             /* n_batch: those rows' rows of out */
    float *      tmp;             /* n_batch * n_vocab when the rows of out are not consecutive; else NULL */
} step;

/* Runs the tokens order[*k ..] that fit one step; advances *k. */
static void run_step(const rm_batch * b, const int32_t * order, const int32_t * dst, int32_t * k, step * st) {
    rm_session * d = b->sessions[0];
    const int64_t V = d->m->hp.n_vocab;
    int32_t n = 0, n_runs = 0, n_out = 0;
    while (*k < b->n_tokens && n < d->n_batch) {
        const int32_t i = order[*k];
        rm_session * o = b->sessions[b->seq[i]];
        if (n_runs == 0 || st->runs[n_runs - 1].s != o) {
            st->runs[n_runs++] = (rm_seq_run) {o, n, 0, o->n_past};
        } else if (st->runs[n_runs - 1].n == o->n_batch) {
            break;   /* a sliding layer's ring holds n_batch new rows of a session at once */
        }
        st->runs[n_runs - 1].n++;
        if (dst[i] >= 0) {
            st->rows[n_out] = n, st->dst[n_out++] = dst[i];
        }
        st->tokens[n++] = b->tokens[i];
        (*k)++;
    }
    int consecutive = 1;
    for (int32_t r = 1; r < n_out; r++) consecutive &= st->dst[r] == st->dst[0] + r;
    float * out = n_out == 0 ? NULL : consecutive ? b->out + (int64_t) st->dst[0] * V : st->tmp;
    rm_session_forward(d, st->runs, n_runs, st->tokens, n, st->rows, n_out, out);
    for (int32_t r = 0; !consecutive && r < n_out; r++) {
        memcpy(b->out + (int64_t) st->dst[r] * V, st->tmp + (int64_t) r * V, sizeof(float) * (size_t) V);
    }
}

rm_status rm_batch_eval(const rm_batch * b) {
    rm_clear_error();
    if (!b || b->struct_size != sizeof(rm_batch)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_batch_eval: batch is NULL or its struct_size is not %zu", sizeof(rm_batch));
    }
    if (b->n_tokens <= 0 || !b->tokens || !b->seq || b->n_sessions <= 0 || !b->sessions || !b->sessions[0]) {
        return rm_fail(RM_E_INVALID_ARG, "rm_batch_eval: needs tokens, seq and sessions (n_tokens = %d, n_sessions = %d)",
                       b->n_tokens, b->n_sessions);
    }
    const int32_t N = b->n_tokens, S = b->n_sessions, B = b->sessions[0]->n_batch;
    const size_t V = (size_t) b->sessions[0]->m->hp.n_vocab;
    int32_t * ints = malloc(sizeof(int32_t) * ((size_t) 4 * S + 2 + 2 * (size_t) N + 3 * (size_t) B));
    rm_seq_run * runs = malloc(sizeof(rm_seq_run) * (size_t) S);
    float * tmp = NULL;
    if (!ints || !runs) {
        free(ints), free(runs);
        return rm_fail(RM_E_OOM, "rm_batch_eval: out of memory for a batch of %d tokens", N);
    }
    int32_t * next = ints, * n_past0 = next + S, * count = n_past0 + S, * first = count + S;   /* first: S + 1 */
    int32_t * order = first + S + 2, * dst = order + N;
    step st = {runs, dst + N, dst + N + B, dst + N + 2 * B, NULL};
    int32_t n_out = 0;
    rm_status rc = check_batch(b, next, &n_out);
    if (rc == RM_OK) {
        memset(count, 0, sizeof(int32_t) * (size_t) S);
        for (int32_t i = 0; i < N; i++) count[b->seq[i]]++;
        group_by_session(b, count, order, dst, first);
        int regrouped = 0;
        for (int32_t k = 0; k < N; k++) regrouped |= order[k] != k;
        if (regrouped && n_out > 0) {   /* a step's rows of out may then not be consecutive */
            st.tmp = tmp = malloc(sizeof(float) * (size_t) (n_out < B ? n_out : B) * V);
            if (!tmp) rc = rm_fail(RM_E_OOM, "rm_batch_eval: out of memory for %d rows of logits", n_out < B ? n_out : B);
        }
    }
    if (rc == RM_OK) {
        for (int32_t j = 0; j < S; j++) n_past0[j] = b->sessions[j]->n_past;
        rm_session * d = b->sessions[0];
        pthread_mutex_lock(&d->m->lock);
        for (int32_t k = 0; k < N && rc == RM_OK;) {
            run_step(b, order, dst, &k, &st);
            rc = d->be->ops->status(d->be);
            rc = rc == RM_OK ? d->xc_status : rc;   /* a streamed model's failed read fails this call only */
        }
        pthread_mutex_unlock(&d->m->lock);
        for (int32_t j = 0; j < S; j++) {
            rm_session * o = b->sessions[j];
            if (rc != RM_OK) {
                o->n_past = n_past0[j];
                if (d->xc_status != RM_OK && o->hy) {   /* a failed read: the recurrent states ran on */
                    rm_hybrid_reset(o->hy, o->m);
                    o->n_past = 0;
                }
                continue;
            }
            o->be->stats.n_tokens += (uint64_t) count[j];
            if (count[j] == 1) {
                if (o != d && o->xc_res_us) {   /* a streamed model's times were measured on d's scratch */
                    memcpy(o->xc_res_us, d->xc_res_us, sizeof(float) * (size_t) d->m->hp.n_layer);
                    memcpy(o->xc_layer_us, d->xc_layer_us, sizeof(float) * (size_t) d->m->hp.n_layer);
                }
                rm_policy_after_token(o);   /* a decoded token, as rm_session_eval steps it */
            }
        }
        if (rc != RM_OK) {
            rc = rm_fail(rc, "rm_batch_eval: %s", rm_last_error());
        }
    }
    free(ints), free(runs), free(tmp);
    return rc;
}
