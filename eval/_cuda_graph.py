"""CUDA-graph capture shared by the benchmarks (each keeps its own replay-timing policy)."""


def capture_graph(fn, warmup_calls: int = 1, stream=None):
    """`fn` run `warmup_calls` times on a side stream (compiles Triton kernels and creates library handles
    before capture, as capture forbids both), then captured once (on `stream`, None: torch's capture stream);
    returns the torch.cuda.CUDAGraph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup_calls):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    return graph


def call_ms(fn, rep_ms: int, warmup_calls: int = 1) -> float:
    """Milliseconds of one call of `fn`: on a GPU the median of triton's do_bench over replays of its CUDA graph;
    without one, a single wall-clock run after a warm-up call (a smoke figure, not a measurement)."""
    import time

    import torch
    import triton.testing

    if not torch.cuda.is_available():
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    graph = capture_graph(fn, warmup_calls)
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(graph.replay, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median")
    del graph
    return ms
