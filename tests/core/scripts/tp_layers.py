"""Run under torchrun: sharded layers loaded from full weights must equal one process's math.

Every rank draws the same full weights (same seed), loads them through the
layers' weight loaders (each rank keeps its shard), runs the forward with the
real collectives, and compares with ``F.linear`` on the full weights. Writes
``rank<N>.json`` into the folder given as the first argument (ranks share
stdout, where lines can interleave); exits non-zero when a difference exceeds 1e-5.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from loader import _distributed as distributed
from loader._session import current_session
from loader.layers import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    SiluAndMul,
    VocabParallelEmbedding,
)
from loader.layers.param_layout import weight_loader_of
from loader.weights import EagerTensor
from tests.helpers.recording_tensor import RecordingTensor
from tests.helpers.torchrun_exit import exit_rank

HIDDEN, INTER, HEADS, KV_HEADS, HEAD, VOCAB = 16, 24, 4, 1, 4, 70
TOLERANCE = 1e-5


def load(param, tensor, shard_id=None):
    weight_loader_of(param)(param, EagerTensor(tensor, "w", "memory"), shard_id)


def main() -> int:
    distributed.init_distributed("cpu")
    session = current_session()
    rank, size = session.tp_rank, session.tp_size
    torch.manual_seed(0)
    # weights scaled like a trained model's (outputs of order one), so 1e-5 is a meaningful bound
    gate, up = torch.randn(INTER, HIDDEN) / HIDDEN**0.5, torch.randn(INTER, HIDDEN) / HIDDEN**0.5
    down, down_bias = torch.randn(HIDDEN, INTER) / INTER**0.5, torch.randn(HIDDEN)
    wq, wk, wv = torch.randn(HEADS * HEAD, HIDDEN), torch.randn(HEAD, HIDDEN), torch.randn(HEAD, HIDDEN)
    bq, bk, bv = torch.randn(HEADS * HEAD), torch.randn(HEAD), torch.randn(HEAD)
    proj, table = torch.randn(10, HIDDEN), torch.randn(VOCAB, HIDDEN)
    x = torch.randn(2, 3, HIDDEN)
    ids = torch.tensor([[0, 5, 63, 64, 69]])

    gate_up = MergedColumnParallelLinear(HIDDEN, [INTER, INTER], prefix="mlp.gate_up_proj")
    down_proj = RowParallelLinear(INTER, HIDDEN, bias=True, prefix="mlp.down_proj")
    load(gate_up.weight, gate, 0)
    load(gate_up.weight, up, 1)
    recorded = RecordingTensor(down, "mlp.down_proj.weight")
    weight_loader_of(down_proj.weight)(down_proj.weight, recorded)
    load(down_proj.bias, down_bias)
    mlp = down_proj(SiluAndMul()(gate_up(x)))
    mlp_ref = F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down, down_bias)

    qkv = QKVParallelLinear(HIDDEN, HEAD, HEADS, KV_HEADS, bias=True, prefix="attn.qkv_proj")
    for sid, w, b in (("q", wq, bq), ("k", wk, bk), ("v", wv, bv)):
        load(qkv.weight, w, sid)
        load(qkv.bias, b, sid)
    q, k, v = qkv(x).split([qkv.q_size, qkv.kv_size, qkv.kv_size], dim=-1)
    q_full = distributed.all_gather(q.contiguous(), dim=-1)

    gathered = MergedColumnParallelLinear(HIDDEN, [INTER, INTER], gather_output=True)
    load(gathered.weight, gate, 0)
    load(gathered.weight, up, 1)
    column = ColumnParallelLinear(HIDDEN, 10, gather_output=True)
    load(column.weight, proj)

    embed = VocabParallelEmbedding(VOCAB, HIDDEN)
    load(embed.weight, table)
    head = ParallelLMHead(VOCAB, HIDDEN).tie_weights(embed)

    errors = {
        "mlp": (mlp - mlp_ref).abs().max().item(),
        "q": (q_full - F.linear(x, wq, bq)).abs().max().item(),
        "k": (k - F.linear(x, wk, bk)).abs().max().item(),
        "v": (v - F.linear(x, wv, bv)).abs().max().item(),
        "merged_gather": (gathered(x) - F.linear(x, torch.cat([gate, up]))).abs().max().item(),
        "column_gather": (column(x) - F.linear(x, proj)).abs().max().item(),
        "embedding": (embed(ids) - F.embedding(ids, table)).abs().max().item(),
        "lm_head": (head(x) - F.linear(x, table)).abs().max().item(),
        "bf16_all_reduce": (distributed.all_reduce(torch.ones(3, dtype=torch.bfloat16)).float() - size)
        .abs().max().item(),
        "bf16_all_gather": (distributed.all_gather(torch.full((2, 1), float(rank), dtype=torch.bfloat16))
                            - torch.arange(size, dtype=torch.bfloat16)).abs().max().item(),
    }
    shapes = {"gate_up": list(gate_up.weight.shape), "down": list(down_proj.weight.shape),
              "qkv": list(qkv.weight.shape), "kv_replicas": qkv.num_kv_head_replicas,
              "embed": list(embed.weight.shape), "logits": list(head(x).shape),
              "down_reads": [list(map(list, window)) for window in recorded.log]}
    result = {"rank": rank, "size": size, "errors": errors, "shapes": shapes}
    (Path(sys.argv[1]) / f"rank{rank}.json").write_text(json.dumps(result))
    return 0 if max(errors.values()) <= TOLERANCE else 1


if __name__ == "__main__":
    exit_rank(main())
