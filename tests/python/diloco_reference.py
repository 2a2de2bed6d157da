"""DiLoCo (Douillard et al., 2023, Algorithm 1) written from the paper in PyTorch: the reference
for tests/unit/test_diloco.cpp, which runs ours (ddp/core/diloco.h) on the same data.

    python3 diloco_reference.py OUT.pt WORKERS

WORKERS replicas of a linear model (y = x W^T + b, float64) start from the same parameters theta.
For each of ROUNDS outer rounds, each replica takes H inner steps of plain SGD (lr INNER_LR) on
batches of its own; then the outer gradient is the mean over replicas of (theta - theta_i), and
the outer optimizer, torch.optim.SGD, steps theta with it: DiLoCo's Nesterov momentum (lr 0.7,
momentum 0.9) and local SGD (lr 1, momentum 0: the replicas averaged). And DiLoCo with a delay
(tau = DELAY, as in "Streaming DiLoCo with overlapping communication", 2025): the outer gradient
is taken after H - tau inner steps, the last tau run while it is in flight, and each replica then
continues from the new theta plus its own progress of those tau steps. OUT.pt holds a dict of
tensors: "W0", "b0", "x.<worker>.<step>", "y.<worker>.<step>", and per variant and round
"<variant>.<round>.W" and "<variant>.<round>.b".
"""
import sys

import torch

ROUNDS, H, DELAY, INNER_LR, BATCH = 3, 4, 2, 0.05, 8
# lr, momentum, nesterov, delay
VARIANTS = {"diloco": (0.7, 0.9, True, 0), "local_sgd": (1.0, 0.0, False, 0),
            "diloco_delayed": (0.7, 0.9, True, DELAY)}


def inner_steps(theta, data):
    w = [p.detach().clone().requires_grad_() for p in theta]
    for x, y in data:
        loss = ((x @ w[0].T + w[1] - y) ** 2).mean()
        grads = torch.autograd.grad(loss, w)
        with torch.no_grad():
            for p, g in zip(w, grads):
                p -= INNER_LR * g
    return [p.detach() for p in w]


def main():
    out, workers = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    saved = {"W0": torch.randn(3, 5, dtype=torch.float64), "b0": torch.randn(3, dtype=torch.float64)}
    data = []
    for i in range(workers):
        data.append([])
        for s in range(ROUNDS * H):
            x = torch.randn(BATCH, 5, dtype=torch.float64)
            y = torch.randn(BATCH, 3, dtype=torch.float64)
            saved[f"x.{i}.{s}"], saved[f"y.{i}.{s}"] = x, y
            data[i].append((x, y))
    for name, (lr, momentum, nesterov, delay) in VARIANTS.items():
        theta = [saved["W0"].clone().requires_grad_(), saved["b0"].clone().requires_grad_()]
        outer = torch.optim.SGD(theta, lr=lr, momentum=momentum, nesterov=nesterov)
        local = [[p.detach().clone() for p in theta] for _ in range(workers)]
        for r in range(ROUNDS):
            first, last = r * H, (r + 1) * H
            launched = [inner_steps(local[i], data[i][first:last - delay]) for i in range(workers)]
            for j, p in enumerate(theta):
                p.grad = torch.stack([p.detach() - rep[j] for rep in launched]).mean(0)
            local = [inner_steps(launched[i], data[i][last - delay:last]) for i in range(workers)]
            outer.step()
            # each replica: the new theta plus its progress since the outer gradient was taken
            for i, (now, then) in enumerate(zip(local, launched)):
                local[i] = [p.detach() + (n - t) for p, n, t in zip(theta, now, then)]
            saved[f"{name}.{r}.W"] = theta[0].detach().clone()
            saved[f"{name}.{r}.b"] = theta[1].detach().clone()
    torch.save(saved, out)


if __name__ == "__main__":
    main()
