/* device.c - the devices a model can run on (device.h), and the choice among them. */
#include "device.h"

#include <stdio.h>

#include "status.h"

/* Every device this library was built with, by the use_gpu value that asks for it. */
static const rm_device_ops * const DEVICES[] = {
    &rm_device_cpu,
    &rm_device_standin,
#ifdef RM_WITH_CUDA
    &rm_device_cuda,
#endif
};

rm_status rm_device_open(const rm_model * m, const rm_model_params * p, const rm_device_ops ** dev, void ** state,
                         rm_gpu_info * gi) {
    *dev = NULL;
    *state = NULL;
    const rm_device_ops * want = NULL;
    for (size_t i = 0; i < sizeof(DEVICES) / sizeof(DEVICES[0]); i++) {
        if (DEVICES[i]->kind == p->use_gpu) want = DEVICES[i];
    }
    if (!want && p->use_gpu != RM_GPU_CUDA) {
        return rm_fail(RM_E_INVALID_ARG, "rm_model_load: use_gpu %d is not one of RM_GPU_NONE (0), RM_GPU_CUDA (1) "
                       "and RM_GPU_STANDIN (2)", p->use_gpu);
    }
    if (!want) {
        snprintf(gi->note, sizeof(gi->note),
                 "a GPU was requested, but this library was built without CUDA (RM_CUDA=OFF); running on the CPU");
    } else if (want != &rm_device_cpu) {
        rm_status st = want->open(m, p, state, gi->note, sizeof(gi->note));
        if (st != RM_OK) {
            return st;
        }
        if (*state) {
            *dev = want;
            gi->active = 1;
            want->describe(*state, gi);
            return RM_OK;
        }
    }
    *dev = &rm_device_cpu;   /* asked for, or the fallback */
    return rm_device_cpu.open(m, p, state, gi->note, sizeof(gi->note));
}
