"""The image processors' own sizing code, run as transformers writes it where its module cannot be
imported here (it needs torchvision), and a real step of a tiny vision-language model with
autotune's batch: shared by the vision-language tests."""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Image sizes (width, height) that take every branch of the resizers: within bounds, below the
# smallest, above the largest, and either way round.
SIZES = [(640, 480), (448, 448), (1280, 720), (224, 224), (100, 57), (3000, 2000), (28, 28), (5000, 4000)]


def transformers_function(model: str, module: str, name: str,
                          namespace: dict[str, Any] | None = None) -> Callable:
    """``name`` of transformers' models/<model>/<module>.py, its source run as it is, alone (in
    ``namespace``: the names it reads)."""
    import transformers

    path = Path(transformers.__file__).parent / "models" / model / f"{module}.py"
    tree = ast.parse(path.read_text())
    found = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name)
    scope: dict[str, Any] = {"math": math, **(namespace or {})}
    exec(compile(ast.Module(body=[found], type_ignores=[]), str(path), "exec"), scope)  # noqa: S102
    return scope[name]


def transformers_smart_resize() -> Callable:
    """transformers' own ``smart_resize`` (models/qwen2_vl/image_processing_qwen2_vl.py)."""
    return transformers_function("qwen2_vl", "image_processing_qwen2_vl", "smart_resize")


def real_model_takes(name: str, count: int, seq_len: int) -> Any:
    """A training step of preset ``name`` on real tensors with ``count`` images of 84 x 56 a row in
    autotune's batch, transformers' checks on (its image tokens must match the features the tower
    makes); asserts each row holds the layout's image tokens, and returns that layout."""
    import torch

    from autotune.workload.models import resolve_model
    from autotune.workload.step import build_model, make_batch
    from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, Images, image_layout

    torch.manual_seed(0)
    model, _ = build_model(resolve_model(name), IMAGE_TEXT_TO_TEXT, None)
    batch = make_batch(model.config, IMAGE_TEXT_TO_TEXT, 2, seq_len, images=Images(count, (84, 56)))
    loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)
    layout = image_layout(model.config, Images(count, (84, 56)))
    tokens = (batch["input_ids"] == model.config.image_token_id).sum(dim=1)
    assert tokens.tolist() == [count * layout.tokens] * 2
    return layout


def given_positions_are_the_models_own(name: str, seq_len: int) -> None:
    """position_ids (the model's get_rope_index) and the tower's indices, given in autotune's batch of
    preset ``name`` (two 84 x 56 images a row), make the logits the model makes computing them itself;
    the padding's positions are not get_rope_index's (0): their logits are not compared."""
    import torch

    from autotune.workload.models import resolve_model
    from autotune.workload.step import build_model, make_batch
    from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, Images

    torch.manual_seed(0)
    model, _ = build_model(resolve_model(name), IMAGE_TEXT_TO_TEXT, None)
    model.eval()
    batch = make_batch(model.config, IMAGE_TEXT_TO_TEXT, 2, seq_len, images=Images(2, (84, 56)))
    own = {k: v for k, v in batch.items() if k != "position_ids" and not k.startswith("image_")}
    own["image_grid_thw"] = batch["image_grid_thw"]
    theirs, _ = model.model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"],
                                           image_grid_thw=batch["image_grid_thw"],
                                           attention_mask=batch["attention_mask"])
    kept = batch["attention_mask"].bool()
    assert torch.equal(batch["position_ids"][:, kept], theirs[:, kept])
    with torch.no_grad():
        assert torch.allclose(model(**batch).logits[kept], model(**own).logits[kept], atol=1e-5)


def image_cell_probes(name: str, mode: str, **step: Any) -> list[Any]:
    """The estimator's probes at batches 2, 3, 4, 5 of preset ``name``'s cell at 256 tokens with two
    112 x 112 images a row, on a 1 GiB card (``step``: more of the Step's fields)."""
    from autotune.request import Step, TableRequest, Target, resolve
    from autotune.tuner import budget_bytes

    resolved = resolve(TableRequest(Step(model=name, image_size="112x112", images_per_sample=2, **step),
                                    Target(gpu_memory="1GiB", backend="estimate"), seq_lens=[256],
                                    modes=mode))
    budget = budget_bytes(resolved.gpu, resolved.margin)
    with resolved.backend.cell(resolved.workload, resolved.modes[0], 256, budget) as cell:
        return [cell.fits(batch) for batch in (2, 3, 4, 5)]
