/* handoff_probe.cu: what one kernel-to-kernel hand-off costs on this GPU,
 * four ways, for a chain of short kernels replayed from a CUDA graph (a
 * forward's norms, RoPE and merge between its GEMMs are such kernels).
 * Each kernel of the chain reads what the one before wrote (one element a
 * thread) and writes it back changed, so every hand-off carries data:
 *   stream: plain stream order (the next kernel starts after the last);
 *   pdl:    programmatic dependent launch, the next kernel launched at
 *           the previous one's trigger, waiting in griddepcontrol.wait
 *           (how the backend chains its kernels);
 *   flag:   launched the same way, but instead of griddepcontrol.wait the
 *           next kernel's blocks spin (acquire) on a counter that every
 *           block of the kernel before increments (release) after its
 *           stores. Under PDL a kernel launches only after every block of
 *           the one before has triggered, i.e. is resident or done, so
 *           the spin cannot keep those blocks from running (each
 *           triggers after its spin: two kernels of the chain resident);
 *   cluster: pdl with the blocks in clusters of 8 that meet at a cluster
 *           barrier before the wait (as norm.cu's split norm does; blocks
 *           rounded down to a multiple of 8).
 * Prints, per way and block count, the median over replays of the time a
 * kernel adds (replay time / chain length). A development probe, not
 * part of the library: `GPU_TEST_PROBE=1 bash tools/gpu-test.sh` builds
 * and runs it, or by hand on the GPU machine:
 *   nvcc -O3 -arch=sm_90a -std=c++17 -o handoff_probe tools/cuda/handoff_probe.cu && ./handoff_probe */
#include "probe.cuh"

enum { WAY_STREAM, WAY_PDL, WAY_FLAG, WAY_CLUSTER, WAYS };

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__global__ void step(float *buf, unsigned *cnt, int k, int way)
{
    if (way == WAY_CLUSTER) {
        asm volatile("griddepcontrol.launch_dependents;");
        asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    } else if (way == WAY_PDL) {
        asm volatile("griddepcontrol.launch_dependents;");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    } else if (way == WAY_FLAG) {
        if (k > 0 && threadIdx.x == 0)
            while (ld_acquire(cnt + k - 1) < gridDim.x)
                ;
        __syncthreads();
        asm volatile("griddepcontrol.launch_dependents;");
    }
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[i] = buf[i] * 0.5f + 1.0f;
    if (way == WAY_FLAG) {
        __syncthreads(); /* every thread's store before the release */
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(cnt + k, 1u);
        }
    }
}

int main()
{
    const int chain = 200, reps = 20, threads = 256;
    const int blocks_set[] = { 8, 132, 264 };
    const char *names[] = { "stream", "pdl", "flag", "cluster" };
    float *buf;
    unsigned *cnt;
    CK(cudaMalloc(&buf, 264 * threads * sizeof(float)));
    CK(cudaMalloc(&cnt, chain * sizeof(unsigned)));
    CK(cudaMemset(buf, 0, 264 * threads * sizeof(float)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf("way     blocks  us per kernel (median of %d replays of %d kernels)\n", reps, chain);
    for (int blocks : blocks_set)
        for (int way = 0; way < WAYS; way++) {
            const int nb = way == WAY_CLUSTER ? blocks / 8 * 8 : blocks;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            CK(cudaMemsetAsync(cnt, 0, chain * sizeof(unsigned), s));
            for (int k = 0; k < chain; k++) {
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(nb);
                cfg.blockDim = dim3(threads);
                cfg.stream = s;
                cudaLaunchAttribute attr[2];
                int na = 0;
                if (way != WAY_STREAM && k > 0) {
                    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    attr[na++].val.programmaticStreamSerializationAllowed = 1;
                }
                if (way == WAY_CLUSTER) {
                    attr[na].id = cudaLaunchAttributeClusterDimension;
                    attr[na++].val.clusterDim = { 8, 1, 1 };
                }
                cfg.attrs = attr;
                cfg.numAttrs = na;
                CK(cudaLaunchKernelEx(&cfg, step, buf, cnt, k, way));
            }
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            std::vector<float> t;
            cudaEvent_t a, b;
            CK(cudaEventCreate(&a));
            CK(cudaEventCreate(&b));
            for (int r = 0; r < reps + 3; r++) {
                CK(cudaEventRecord(a, s));
                CK(cudaGraphLaunch(ge, s));
                CK(cudaEventRecord(b, s));
                CK(cudaEventSynchronize(b));
                float ms;
                CK(cudaEventElapsedTime(&ms, a, b));
                if (r >= 3)
                    t.push_back(ms * 1000.0f / chain);
            }
            std::sort(t.begin(), t.end());
            printf("%-7s %6d  %.2f (min %.2f)\n", names[way], nb, t[t.size() / 2], t[0]);
            CK(cudaEventDestroy(a));
            CK(cudaEventDestroy(b));
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
    CK(cudaStreamDestroy(s));
    CK(cudaFree(buf));
    CK(cudaFree(cnt));
    return 0;
}
