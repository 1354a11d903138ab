/* gdn_rule.h - internal: the delta rule's one loop skeleton (rm_gdn_rule of gdn.h), written once
 * over a few vector steps that the including file defines first, so the scalar twin (cpu/gdn.c)
 * and the vector forms (cpu/gdn_x86.h) cannot drift apart in their order of operations:
 *
 *     GDN_RULE_NAME                   the function's name
 *     float GDN_DOT(a, b, n)          sum a[i] * b[i]
 *     GDN_MATVEC2(S, k, q, dk, dv, u, r)   u = S^T k, r = S^T q (S: dk rows of dv)
 *     GDN_UROW(n, beta, e, v, u)      u[j] = beta * (v[j] - e * u[j])
 *     GDN_SCALE(n, a, x, y)           y[j] = a * x[j]
 *     GDN_AXPY(n, a, x, y)            y[j] += a * x[j]
 *
 * Each token is one row of its position's chunk: its output reads the chunk's start state and
 * the rows before it, never a row after it, so its floats do not depend on how many tokens came
 * in the same call (gdn.h). */
#include <math.h>
#include <string.h>

static void GDN_RULE_NAME(const rm_gdn_head * h, int32_t pos, float * state, float * scratch) {
    const int32_t dk = h->d_k, dv = h->d_v, C = RM_GDN_CHUNK;
    float * S = state;                              /* the state at the chunk's start */
    float * PK = S + (int64_t) dk * dv;             /* the chunk's keys, ne = {d_k, C} */
    float * PU = PK + (int64_t) C * dk;             /* their u, ne = {d_v, C} */
    float * PG = PU + (int64_t) C * dv;             /* their cumulative log-decays, C */
    float * R = scratch;                            /* S0^T q of the token, d_v */
    for (int32_t t = 0; t < h->n_tok; t++) {
        const int32_t r = (int32_t) (((int64_t) pos + t) % C);   /* the token's row in its chunk */
        const float * q = h->q + t * h->qk_stride, * k = h->k + t * h->qk_stride, * v = h->v + t * h->v_stride;
        const float beta = h->beta[t * h->gb_stride];
        const float G = (r > 0 ? PG[r - 1] : 0.0f) + h->g[t * h->gb_stride];
        const float e = expf(G);
        float * ur = PU + (int64_t) r * dv;
        PG[r] = G;
        memcpy(PK + (int64_t) r * dk, k, sizeof(float) * (size_t) dk);
        GDN_MATVEC2(S, k, q, dk, dv, ur, R);
        GDN_UROW(dv, beta, e, v, ur);               /* forward substitution for u_r */
        for (int32_t s = 0; s < r; s++) {
            const float a = beta * GDN_DOT(k, PK + (int64_t) s * dk, dk) * expf(G - PG[s]);
            GDN_AXPY(dv, -a, PU + (int64_t) s * dv, ur);
        }
        float * o = h->o + t * h->o_stride;         /* o = e^G S0^T q + the chunk's rows so far */
        GDN_SCALE(dv, e, R, o);
        for (int32_t s = 0; s <= r; s++) {
            GDN_AXPY(dv, GDN_DOT(q, PK + (int64_t) s * dk, dk) * expf(G - PG[s]), PU + (int64_t) s * dv, o);
        }
        if (r == C - 1) {                           /* the chunk is complete: the next one's S0 */
            for (int32_t i = 0; i < dk; i++) {
                GDN_SCALE(dv, e, S + (int64_t) i * dv, S + (int64_t) i * dv);
            }
            for (int32_t s = 0; s < C; s++) {
                const float es = expf(G - PG[s]);
                for (int32_t i = 0; i < dk; i++) {
                    GDN_AXPY(dv, es * PK[(int64_t) s * dk + i], PU + (int64_t) s * dv, S + (int64_t) i * dv);
                }
            }
        }
    }
}

#undef GDN_RULE_NAME
#undef GDN_DOT
#undef GDN_MATVEC2
#undef GDN_UROW
#undef GDN_SCALE
#undef GDN_AXPY
