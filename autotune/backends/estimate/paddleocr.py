"""PaddleOCR-VL's projector on fake tensors: its per-image loop, batched.

``PaddleOCRProjector.forward`` (models/paddleocr_vl/modeling_paddleocr_vl.py, transformers 5.24) splits the
tower's output by image (``image_grid_thw.prod(dim=1).tolist()``) and, for each image, normalizes it
(``pre_norm``), regroups its grid into 2 x 2 blocks (reshape, transpose, reshape: a copy), runs
``linear_1``, GELU and ``linear_2``, then concatenates the images' outputs. A loop whose length is the
step's image count makes a trace whose number of allocations changes with the batch, which the estimator
cannot extrapolate (trace.py): every probe would trace the model again. Every image of autotune's layout
has one size (workload/vision.py), so each pass is like the others: ``route_paddleocr`` runs the loop as
one pass over all the images (the same modules on a leading image axis), which makes the same values
(tested against the model's own on real tensors) and each of the loop's tensors once, images-fold, where
the loop makes one an image; the final ``cat`` (a copy of every image's output) stays. The vision
attention's own per-image loop is routed as Qwen2-VL's is (vision.py ``route_vision_attention``).
"""

from __future__ import annotations

import types
from typing import Any

PROJECTOR = "PaddleOCRProjector"


def route_paddleocr(model: Any) -> None:
    """Batch the per-image loop of a PaddleOCR-VL projector (module docstring); other models are left
    as they are."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for module in base.modules():
        if type(module).__name__ == PROJECTOR:
            module.forward = types.MethodType(projector_forward, module)


def projector_forward(self: Any, image_features: Any, image_grid_thw: Any) -> Any:
    """``PaddleOCRProjector.forward`` (transformers 5.24) as one pass over every image where all have
    one grid (module docstring); the model's own otherwise."""
    grids = {tuple(int(n) for n in row) for row in image_grid_thw.tolist()}
    if len(grids) != 1:
        return type(self).forward(self, image_features, image_grid_thw)
    (t, h, w), = grids
    m1, m2 = self.merge_kernel_size
    images, d = len(image_grid_thw), image_features.shape[-1]
    # The loop's split, one image a row of the leading axis (a view), then its pre_norm and regrouping.
    image_feature = self.pre_norm(image_features.reshape(images, t * h * w, d))
    image_feature = image_feature.reshape(images, t, h // m1, m1, w // m2, m2, d).transpose(3, 4)
    image_feature = image_feature.reshape(images, t * (h // m1) * (w // m2), m1 * m2 * d)
    hidden_states = self.linear_2(self.act(self.linear_1(image_feature)))
    # The loop's torch.cat of the images' outputs: one new tensor of them all (a copy, even of one).
    return hidden_states.flatten(0, 1).clone()
