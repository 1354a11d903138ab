/* gating.h - internal: the DeepSeek/GLM router (gating.c) on one token's logits, on the host. */
#ifndef RM_GATING_H
#define RM_GATING_H

#include <stdint.h>

#include "rapidmoe.h"

struct rm_route;
typedef struct rm_gating_params rm_gating_params;   /* backend.h */


/* k routes of one token from its n_expert router logits; bias (n_expert, may be NULL) counts for
 * the choice only; chosen (k expert ids, may be NULL: by score) is the choice itself. n_expert <= 512. */
void rm_route_token_gated(const float * logits, const float * bias, const rm_gating_params * g, int32_t n_expert,
                          int32_t k, const int32_t * chosen, struct rm_route * out);

/* sqrt(softplus(x)), softplus linear past 20 as torch's (DeepSeek-V4's scores) */
float rm_sqrt_softplus(float x);

/* 1 when the parameters describe the softmax router every backend runs (backend.h's route). */
int rm_gating_is_plain(const rm_gating_params * g, const float * bias);

#endif
