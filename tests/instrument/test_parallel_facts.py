"""The ``parallel`` facts read from live DDP, FSDP2, FSDP1 and device-split models (CPU).

Process groups are real: gloo of one rank over a file store for DDP, torch's fake process
group for one rank of a larger FSDP job (``world_size`` 4 or 8 in this process), the way
``docs/facts.md`` says the facts are read inside a real run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from ranks_cases import MLP  # noqa: E402

import gpuwatch  # noqa: E402
from gpuwatch.instrument._facts import collect_facts  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture
def fake_group() -> Iterator[Any]:
    """Rank 0 of an 8-rank job through torch's fake process group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield dist
    dist.destroy_process_group()


@pytest.fixture
def gloo_group(tmp_path) -> Iterator[Any]:
    """A real gloo process group of one rank."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield dist
    dist.destroy_process_group()


def _sharded(reshard: bool = True, **kw: Any) -> Any:
    from torch.distributed.fsdp import fully_shard

    model = MLP(256, 3)
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard, **kw)
    fully_shard(model, reshard_after_forward=reshard, **kw)
    return model


BLOCK = 2 * (256 * 256 + 256)
"""Elements in one block of MLP(256): two square Linear layers with biases."""


def test_fsdp2_params_are_this_ranks_shards(fake_group: Any) -> None:
    model = _sharded()
    opt = torch.optim.AdamW(model.parameters())
    f = collect_facts(model, opt)
    # Each rank holds an eighth: never the global numel().
    assert f["params"]["bytes"] == 3 * BLOCK * 4 // 8
    assert f["params"]["trainable_bytes"] == 3 * BLOCK * 4 // 8
    assert f["optimizer"]["groups"][0]["bytes"] == 3 * BLOCK * 4 // 8
    assert f["optimizer"]["groups"][0]["max_tensor_bytes"] == 256 * 256 * 4 // 8
    par = f["parallel"]
    assert (par["strategy"], par["rank"], par["world_size"]) == ("fsdp2", 0, 8)
    fsdp = par["fsdp"]
    assert (fsdp["version"], fsdp["mesh_size"], fsdp["units"]) == (2, 8, 3)
    assert fsdp["backend"] == "fake"  # the process group's (gloo's all-gathers differ)
    assert fsdp["largest_unit_bytes"] == BLOCK * 4
    assert [u["name"] for u in fsdp["unit_list"]] == ["blocks.0", "blocks.1", "blocks.2"]
    assert all(u["sharded_bytes"] == BLOCK * 4 // 8 for u in fsdp["unit_list"])
    assert fsdp["reshard_after_forward"] is True
    assert (fsdp["param_dtype"], fsdp["reduce_dtype"], fsdp["cpu_offload"]) == (
        None,
        None,
        False,
    )
    assert par["dtensor"]["global_bytes"] == 3 * BLOCK * 4


def test_fsdp2_policies(fake_group: Any) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = _sharded(reshard=False, mp_policy=mp, offload_policy=CPUOffloadPolicy(pin_memory=False))
    fsdp = collect_facts(model)["parallel"]["fsdp"]
    assert fsdp["reshard_after_forward"] is False
    assert (fsdp["param_dtype"], fsdp["reduce_dtype"], fsdp["cpu_offload"]) == (
        "bfloat16",
        "float32",
        True,
    )
    # The all-gather makes the unit in the policy's param dtype: 2 bytes an element.
    assert fsdp["largest_unit_bytes"] == BLOCK * 2


def test_fsdp1_strategy_and_flat_parameters(fake_group: Any) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    wrapped = FSDP(
        MLP(256, 2),
        device_id=torch.device("cpu"),
        sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
    )
    f = collect_facts(wrapped.module, wrapper=wrapped)
    fsdp = f["parallel"]["fsdp"]
    assert (f["parallel"]["strategy"], fsdp["version"]) == ("fsdp1", 1)
    assert (fsdp["strategy"], fsdp["mesh_size"], fsdp["units"]) == ("SHARD_GRAD_OP", 8, 1)
    assert fsdp["largest_unit_bytes"] == 2 * BLOCK * 4
    assert fsdp["flat_bytes"] == 2 * BLOCK * 4 // 8
    # The parameters this rank holds: its shard of the flat parameter, not the views of it
    # the model inside keeps (nor nothing at all).
    assert f["params"]["bytes"] == 2 * BLOCK * 4 // 8


def test_ddp_options(gloo_group: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(MLP(256, 2), bucket_cap_mb=5, gradient_as_bucket_view=True, static_graph=True)
    f = collect_facts(ddp.module, torch.optim.SGD(ddp.parameters()), wrapper=ddp)
    par = f["parallel"]
    assert (par["strategy"], par["world_size"]) == ("ddp", 1)
    assert par["ddp"] == {
        "bucket_cap_bytes": 5 * 2**20,
        "first_bucket_bytes": par["ddp"]["first_bucket_bytes"],
        "gradient_as_bucket_view": True,
        "static_graph": True,
        "find_unused_parameters": False,
        "broadcast_buffers": True,
        "world_size": 1,
    }
    assert par["ddp"]["first_bucket_bytes"] > 0
    # DDP replicates: each rank holds the whole model.
    assert f["params"]["bytes"] == 2 * BLOCK * 4


def test_watch_reads_the_layout_from_the_wrapper_it_was_given(gloo_group: Any, sent: list) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(MLP(64, 2), find_unused_parameters=True)
    gpuwatch.watch(ddp, torch.optim.AdamW(ddp.parameters()))
    par = sent[-1]["parallel"]
    assert par["strategy"] == "ddp"
    assert par["ddp"]["find_unused_parameters"] is True


def test_a_model_split_over_devices_says_what_each_holds() -> None:
    model = MLP(64, 2)
    model.hf_device_map = {"blocks.0": "cpu", "blocks.1": "cpu"}  # accelerate's map
    par = collect_facts(model)["parallel"]
    assert par["strategy"] == "device_map"
    assert par["devices"] == {"cpu": 4 * (64 * 64 + 64) * 4}


def test_meta_parameters_are_no_device() -> None:
    """Parameters on ``meta`` hold nothing: beside the CPU's they make no device map
    (issue 39, item 5)."""
    model = MLP(64, 2)
    model.blocks[1].to("meta")
    facts = collect_facts(model)
    assert "parallel" not in facts
    assert facts["params"]["bytes"] == 2 * (64 * 64 + 64) * 4


def test_one_device_without_a_process_group_has_no_parallel_facts() -> None:
    assert "parallel" not in collect_facts(MLP(64, 2))


def test_activations_are_measured_under_fsdp2(fake_group: Any, sent: list) -> None:
    """FSDP2's unsharded parameters are weights: the measurement neither breaks on its
    sharded DTensor parameters nor counts the unsharded ones autograd saves."""
    x = torch.randn(16, 256)
    plain = MLP(256, 3)
    gpuwatch.watch(plain, torch.optim.AdamW(plain.parameters()))
    plain(x).square().mean().backward()
    expected = sent[-1]["activations"]
    assert expected["bytes"] > 0 and not expected.get("skipped")

    model = _sharded()
    gpuwatch.watch(model, torch.optim.AdamW(model.parameters()))
    model(x).square().mean().backward()
    got = sent[-1]["activations"]
    assert not got.get("skipped") and not got.get("error"), got
    assert (got["bytes"], got["tensors"]) == (expected["bytes"], expected["tensors"])
    grads = sum(m["grad_bytes"] for m in got["modules"])
    assert grads == 3 * BLOCK * 4 // 8  # this rank's gradient shards
