"""nexus bench: the benchmark suites. Each suite's command lives in its own module; its logic in lab/."""

import typer

from . import (bench_args, bench_cards, bench_deep_splice, bench_drafts, bench_l0, bench_latency, bench_lso,
               bench_poisoning, bench_routing, bench_serve, bench_slb)

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None)
app.command("slb", help="INT8 SLB scan latency against NumPy baselines.")(bench_slb.command)
app.command("latency", help="Where users wait: SLB kernel, scan step, request encoder, warm and one-shot route, each against its baseline.")(
    bench_latency.command
)
app.command("deep-splice", help="Table III: splice + repair TTFT against text prefill, per K and depth.")(
    bench_deep_splice.command
)
app.command("card-splice", help="Sessions: the tool's card spliced after the conversation against re-prefilled; the repair calibrated per model.")(
    bench_cards.command
)
app.command("routing", help="Routing accuracy against registry size (Fig 5, Table IV).")(bench_routing.command)
app.command("routing-lso", help="Routing on servers the router embedder never trained on (leave-servers-out).")(
    bench_lso.command
)
app.command("args", help="Argument fidelity and first-argument latency against full-schema re-prefill.")(
    bench_args.command
)
app.command("drafts", help="Arguments decoded with drafted tokens verified in batches against one token at a time.")(
    bench_drafts.command
)
app.command("l0", help="L0 exact-token radix arena: warm-hit rate and copy latency.")(bench_l0.command)
app.command("serve", help="nexus serve under hostile clients: mixed bad frames, SIGTERM under load, memory.")(bench_serve.command)
app.command("poisoning", help="Hostile servers in the registry: requests stolen, defences off and on.")(bench_poisoning.command)
