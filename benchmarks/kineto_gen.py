"""Synthetic multi-rank Kineto (PyTorch-profiler) traces of realistic shape,
deterministic (for benchmarks, not tests).

Per rank: ``--kernels`` GPU kernels, each with its ``cudaLaunchKernel``
runtime event (correlation id) and an enclosing ``aten::`` CPU op (External
id); every 10th kernel an NCCL all_reduce (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``,
with the collective args Kineto writes); ``--steps`` ``ProfilerStep#N``
annotations; ``distributedInfo`` with rank and world size.

    python benchmarks/kineto_gen.py OUT_DIR --ranks 8 --kernels 200000
"""
import argparse
import gzip
import json
import os
import random

KERNELS = ["void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)",
           "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off",
           "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct)",
           "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(at::native::ReduceOp<float>)",
           "Memcpy DtoD (Device -> Device)"]
OPS = ["aten::add_", "aten::mm", "aten::cudnn_batch_norm", "aten::sum", "aten::copy_"]


def rank_trace(rank, world, n_kernels, n_steps, seed=0):
    rng = random.Random(seed * 7919 + rank)
    ev = []
    t = 1_000_000.0
    per_step = n_kernels // n_steps
    corr = 1
    k = 0
    for step in range(n_steps):
        step_start = t
        step_events = []
        for _ in range(per_step):
            ext = corr
            if k % 10 == 9:
                op, kname, cat = "nccl:all_reduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel"
                args = {"External id": ext, "correlation": corr, "Collective name": "allreduce", "dtype": "Float",
                        "In msg nelems": 262144, "Out msg nelems": 262144, "Group size": world,
                        "Process Group Name": "0", "stream": 20, "device": rank}
            else:
                j = rng.randrange(len(KERNELS))
                op, kname = OPS[j], KERNELS[j]
                cat = "gpu_memcpy" if kname.startswith("Memcpy") else "kernel"
                args = {"External id": ext, "correlation": corr, "stream": 7, "device": rank,
                        "grid": [128, 1, 1], "block": [256, 1, 1], "registers per thread": 32}
            op_dur = 4.0 + rng.random() * 3
            step_events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 100 + rank, "tid": 100 + rank,
                                "ts": t, "dur": op_dur, "args": {"External id": ext, "Sequence number": k}})
            step_events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100 + rank,
                                "tid": 100 + rank, "ts": t + 1.0, "dur": 2.5,
                                "args": {"External id": ext, "correlation": corr, "cbid": 211}})
            kdur = 5.0 + rng.random() * 40 if not op.startswith("nccl") else 80 + rng.random() * 200
            step_events.append({"ph": "X", "cat": cat, "name": kname, "pid": rank, "tid": 7 if cat != "kernel" or
                                not op.startswith("nccl") else 20, "ts": t + 20.0, "dur": kdur, "args": args})
            t += op_dur + 1.0
            corr += 1
            k += 1
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 100 + rank,
                   "tid": 100 + rank, "ts": step_start, "dur": t - step_start})
        ev.extend(step_events)
        t += 50.0
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "deviceProperties": [{"id": rank, "name": "NVIDIA H100 80GB HBM3"}],
            "traceEvents": ev, "baseTimeNanoseconds": 1_700_000_000_000_000_000}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--kernels", type=int, default=200_000)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--clone", action="store_true",
                   help="write rank 0's events once and give every other rank a copy (only distributedInfo "
                        "differs): many ranks in minutes, for memory-vs-ranks measurements")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    template = None
    for r in range(a.ranks):
        path = os.path.join(a.out, f"rank{r}.json.gz")
        if os.path.exists(path):
            continue
        if a.clone:
            if template is None:
                doc = rank_trace(0, a.ranks, a.kernels, a.steps)
                info = json.dumps(doc.pop("distributedInfo"))
                template = (info, json.dumps(doc))
            body = template[1].replace("{", "{" + '"distributedInfo": ' + template[0].replace(
                '"rank": 0', f'"rank": {r}') + ", ", 1)
            with gzip.open(path, "wt", compresslevel=1) as fh:
                fh.write(body)
        else:
            with gzip.open(path, "wt", compresslevel=1) as fh:
                json.dump(rank_trace(r, a.ranks, a.kernels, a.steps), fh)
        print(path, os.path.getsize(path) // 1024, "KiB", flush=True)


if __name__ == "__main__":
    main()
