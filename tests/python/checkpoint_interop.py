"""Python's side of the checkpoint interop tests (Debian's python3-torch).

  check-ours DIR MODEL TOL
                     loads DIR/model.pt (written by ddp) with torch.load's weights_only=True into
                     nn.DataParallel(MODEL) (mlp or resnet18) with strict=True, runs DIR/batch.pt's
                     input in eval mode and compares with the output ddp computed; exits 1 when
                     they differ by more than TOL.
  check-checkpoint DIR
                     the same for ddp's DIR/checkpoint.pt (its "model", an mlp), loaded both with
                     torch.load's default and with weights_only=True; prints its GradScaler state
                     ("grad_scaler") as GradScaler.state_dict() when it has one.
  check-informer DIR TOL
                     the same for ddp's Informer: DIR/model.pt into nn.DataParallel of
                     bench/informer_reference.py's make_informer (Informer2020's module names),
                     built from the sizes in DIR/batch.pt (0-dim int64 tensors enc_in, dec_in,
                     c_out, seq_len, label_len, pred_len, factor, d_model, n_heads, e_layers,
                     d_layers, d_ff) with dropout 0, run on its x_enc, mark_enc, x_dec, mark_dec
                     in eval mode and compared with its output. ProbAttention samples keys at
                     random, so the two sides agree only where every query is active: a factor
                     with factor * ceil(ln L) >= L for each attention's query length L.
  check-gathered DIR the files a sharded (--fsdp) run of the mlp wrote, with weights_only=True:
                     DIR/model.pt loads strictly into nn.DataParallel(mlp), DIR/checkpoint.pt's
                     "model" equals it, and each of its "optimizer_tensors" ("<i>.<name>") has
                     the shape of the model's i-th parameter.
  save-python DIR    writes an MLP's weights the ways Python users do, and its output on a batch,
                     for ddp to load:
                       plain.pt       torch.save(dict(model.state_dict()))
                       prefixed.pt    torch.save(dict(nn.DataParallel(model).state_dict()))
                       ordered.pt     torch.save(model.state_dict())  (an OrderedDict)
                       cuda.pt        dict(model.state_dict()) as saved on a GPU (location cuda:0)
                       batch.pt       {"input": x, "output": model(x)}
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.serialization


def mlp():
    # ddp::models::make_mlp(784, 10): the same modules, so the same state dict keys.
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                         nn.ReLU(), nn.Linear(256, 10))


class Residual(nn.Module):
    """d2l's Residual (d2l.torch.Residual), as the multi-GPU tutorial uses it."""

    def __init__(self, input_channels, num_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(input_channels, num_channels, kernel_size=3, padding=1,
                               stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, kernel_size=3, padding=1)
        if use_1x1conv:
            self.conv3 = nn.Conv2d(input_channels, num_channels, kernel_size=1, stride=strides)
        else:
            self.conv3 = None
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        Y += X
        return F.relu(Y)


def resnet18(num_classes=10, in_channels=1):
    """The tutorial's resnet18, verbatim but for the names."""
    def resnet_block(in_channels, out_channels, num_residuals, first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(Residual(in_channels, out_channels, use_1x1conv=True, strides=2))
            else:
                blk.append(Residual(out_channels, out_channels))
        return nn.Sequential(*blk)

    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU())
    net.add_module("resnet_block1", resnet_block(64, 64, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(64, 128, 2))
    net.add_module("resnet_block3", resnet_block(128, 256, 2))
    net.add_module("resnet_block4", resnet_block(256, 512, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net


def check_ours(directory, model_name="mlp", tolerance="1e-5"):
    weights = torch.load(f"{directory}/model.pt", weights_only=True)
    model = nn.DataParallel({"mlp": mlp, "resnet18": resnet18}[model_name]())
    model.load_state_dict(weights, strict=True)
    batch = torch.load(f"{directory}/batch.pt", weights_only=True)
    model.eval()
    with torch.no_grad():
        output = model(batch["input"])
    diff = (output - batch["output"]).abs().max().item()
    print(f"keys {sorted(weights)}; max abs diff {diff:.3g}")
    return 0 if diff <= float(tolerance) else 1


def check_checkpoint(directory):
    """DIR/checkpoint.pt (ddp's) with torch.load's default (weights_only=True from PyTorch 2.6 on)
    and with weights_only=True: its "model" loads strictly into nn.DataParallel(mlp())."""
    batch = torch.load(f"{directory}/batch.pt", weights_only=True)
    outputs = []
    for kwargs in ({}, {"weights_only": True}):
        checkpoint = torch.load(f"{directory}/checkpoint.pt", **kwargs)
        assert checkpoint["format"] == "ddp.checkpoint", checkpoint.get("format")
        model = nn.DataParallel(mlp())
        model.load_state_dict(checkpoint["model"], strict=True)
        model.eval()
        with torch.no_grad():
            outputs.append((model(batch["input"]) - batch["output"]).abs().max().item())
    print(f"torch {torch.__version__}; epoch {checkpoint['epoch']}; max abs diffs {outputs}")
    if "grad_scaler" in checkpoint:  # --amp fp16: GradScaler.state_dict() with its floats as tensors
        state = {k: v.item() if torch.is_tensor(v) else v for k, v in checkpoint["grad_scaler"].items()}
        print("grad_scaler", sorted((k, type(v).__name__, v) for k, v in state.items()))
    return 0 if max(outputs) <= 1e-5 else 1


def check_gathered(directory):
    weights = torch.load(f"{directory}/model.pt", weights_only=True)
    model = nn.DataParallel(mlp())
    model.load_state_dict(weights, strict=True)
    checkpoint = torch.load(f"{directory}/checkpoint.pt", weights_only=True)
    assert sorted(checkpoint["model"]) == sorted(weights), sorted(checkpoint["model"])
    for key, value in weights.items():
        assert torch.equal(checkpoint["model"][key], value), key
    params = list(model.parameters())
    for key, value in checkpoint["optimizer_tensors"].items():
        index = int(key.split(".")[0])
        assert value.shape == params[index].shape, (key, value.shape, params[index].shape)
    print(f"model.pt loaded; {len(checkpoint['optimizer_tensors'])} optimizer tensors shaped as "
          f"their parameters")
    return 0


def check_informer(directory, tolerance):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
    from informer_reference import make_informer

    weights = torch.load(f"{directory}/model.pt", weights_only=True)
    batch = torch.load(f"{directory}/batch.pt", weights_only=True)
    sizes = {k: int(batch[k]) for k in ("enc_in", "dec_in", "c_out", "seq_len", "label_len", "pred_len",
                                        "factor", "d_model", "n_heads", "e_layers", "d_layers", "d_ff")}
    model = nn.DataParallel(make_informer(**sizes, dropout=0.0))
    model.load_state_dict(weights, strict=True)
    model.eval()
    with torch.no_grad():
        output = model(batch["x_enc"], batch["mark_enc"], batch["x_dec"], batch["mark_dec"])
    diff = (output - batch["output"]).abs().max().item()
    print(f"{len(weights)} keys; max abs diff {diff:.3g}")
    return 0 if diff <= float(tolerance) else 1


def save_python(directory):
    torch.manual_seed(7)
    model = mlp().eval()
    torch.save(dict(model.state_dict()), f"{directory}/plain.pt")
    torch.save(dict(nn.DataParallel(model).state_dict()), f"{directory}/prefixed.pt")
    torch.save(model.state_dict(), f"{directory}/ordered.pt")
    # What a GPU machine writes: the storages say cuda:0. Python itself refuses to load this on a
    # CPU-only machine without map_location.
    real_tag = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(dict(model.state_dict()), f"{directory}/cuda.pt")
    finally:
        torch.serialization.location_tag = real_tag
    try:
        torch.load(f"{directory}/cuda.pt")
        print("cuda.pt loaded without map_location: not a GPU-saved file")
        return 1
    except RuntimeError:
        pass
    x = torch.randn(16, 1, 28, 28)
    with torch.no_grad():
        torch.save({"input": x, "output": model(x)}, f"{directory}/batch.pt")
    return 0


if __name__ == "__main__":
    mode = sys.argv[1]
    sys.exit({"check-ours": check_ours, "check-checkpoint": check_checkpoint,
              "check-gathered": check_gathered,
              "check-informer": check_informer,
              "save-python": save_python}[mode](*sys.argv[2:]))
