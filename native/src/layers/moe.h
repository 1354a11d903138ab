/* moe.h - internal: the MoE block (routing, residual selection, experts). */
#ifndef RM_MOE_H
#define RM_MOE_H

#include "session.h"

/* x += MoE(ffn_norm(x)) for the n tokens in the session's scratch, layer il. */
void rm_moe_block(rm_session * s, int il, int32_t n);

#endif
