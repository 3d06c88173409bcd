"""CUDA-graph capture shared by the benchmarks (each keeps its own replay-timing policy)."""


def capture_graph(fn, warmup_calls: int = 1):
    """`fn` run `warmup_calls` times on a side stream (compiles Triton kernels and creates library handles
    before capture, as capture forbids both), then captured once; returns the torch.cuda.CUDAGraph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup_calls):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph
