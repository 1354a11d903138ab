/* cpu/device.c - the CPU as a device (device.h): at load, the weights its kernels read faster
 * in their own layout (repack.h); per session, a CPU backend that reads them. */
#include "device.h"

#include "repack.h"
#include "status.h"

static rm_status cpu_open(const rm_model * m, const rm_model_params * p, void ** out, char * note, size_t note_cap) {
    int failed = 0;
    *out = rm_repack_model(m, m->pool, &failed);
    return failed ? RM_E_OOM : RM_OK;
}

static void cpu_close(void * repacked) { rm_repack_free(repacked); }

static rm_backend * cpu_backend_new(void * repacked, const rm_model * m, int32_t n_batch, int64_t max_in, int32_t n_ctx,
                                    rm_status * st) {
    rm_backend * be = rm_backend_cpu_new(m->pool, n_batch, max_in, n_ctx);
    if (!be) {
        *st = RM_E_OOM;
        rm_fail(RM_E_OOM, "rm_session_new: out of memory for the CPU backend's scratch");
        return NULL;
    }
    rm_backend_cpu_use_repacked(be, repacked);
    *st = RM_OK;
    return be;
}

const rm_device_ops rm_device_cpu = {
    .name        = "cpu",
    .kind        = RM_GPU_NONE,
    .open        = cpu_open,
    .describe    = NULL,
    .close       = cpu_close,
    .backend_new = cpu_backend_new,
};
