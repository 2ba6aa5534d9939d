"""A synchronised BatchNorm written from all-reduce, for CPU and gloo.

Used by ``03e1_data_inconsistency`` (data inconsistency: each rank's BatchNorm sees only its own
shard of the batch) and its exercise ``check_sync_batch_stats``. PyTorch's
``nn.SyncBatchNorm`` refuses CPU tensors, so this is the same algorithm in about 80 lines:

* forward: ONE all-reduce of (per-channel sum, sum of squares, count) gives the mean and the
  variance of the whole global batch; every rank normalises with them and updates its running
  statistics identically;
* backward: ONE all-reduce of (sum of dy, sum of dy * x_hat) gives the two global means the
  input gradient needs. Weight and bias gradients stay this rank's share, as in PyTorch: data
  parallelism (DDP) then averages them over the ranks with every other gradient.

Asserted equal to single-process ``nn.BatchNorm`` on the whole batch (outputs, running
statistics, gradients) in ``tests/test_sync_batchnorm.py``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))  # every dim but channels (dim 1)


def sync_batch_stats(x, group=None):
    """Per-channel mean and biased variance of the batch formed by every rank's ``x``.

    Sums travel in float64, so E[x^2] - E[x]^2 loses far less to cancellation than in float32;
    the count travels too, because ranks may hold batches of different sizes.
    """
    dims, C = _reduce_dims(x), x.shape[1]
    xd = x.detach().double()
    stats = torch.cat([xd.sum(dims), (xd * xd).sum(dims),
                       torch.tensor([x.numel() / C], dtype=torch.float64)])
    dist.all_reduce(stats, group=group)
    count = stats[-1]
    mean = stats[:C] / count
    var = stats[C:2 * C] / count - mean * mean
    return mean.to(x.dtype), var.clamp_min(0).to(x.dtype), int(count)


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group):
        mean, var, count = sync_batch_stats(x, group)
        if running_mean is not None:  # PyTorch keeps the unbiased variance as running_var
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(momentum * mean)
                running_var.mul_(1 - momentum).add_(momentum * var * count / max(count - 1, 1))
        shape = [1, -1] + [1] * (x.dim() - 2)
        invstd = torch.rsqrt(var + eps)
        x_hat = (x - mean.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(x_hat, weight, invstd)
        ctx.count, ctx.group = count, group
        if weight is None:
            return x_hat
        return x_hat * weight.view(shape) + bias.view(shape)

    @staticmethod
    def backward(ctx, grad_out):
        x_hat, weight, invstd = ctx.saved_tensors
        dims, C = _reduce_dims(grad_out), grad_out.shape[1]
        shape = [1, -1] + [1] * (grad_out.dim() - 2)
        local = torch.cat([grad_out.sum(dims), (grad_out * x_hat).sum(dims)])
        grad_bias, grad_weight = local[:C].clone(), local[C:].clone()  # this rank's share
        dist.all_reduce(local, group=ctx.group)  # the whole batch's sums
        mean_dy = (local[:C] / ctx.count).view(shape)
        mean_dy_xhat = (local[C:] / ctx.count).view(shape)
        scale = invstd if weight is None else invstd * weight
        grad_x = scale.view(shape) * (grad_out - mean_dy - x_hat * mean_dy_xhat)
        if weight is None:
            return grad_x, None, None, None, None, None, None, None
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training-mode statistics are those of the global batch (all ranks).

    A drop-in for ``nn.BatchNorm1d/2d/3d``; in eval mode, or without a process group of more
    than one rank, it is plain BatchNorm.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, group=None):
        if momentum is None:
            raise ValueError("momentum=None (cumulative average) is not supported; "
                             "use a number such as 0.1")
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.group = group

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"expected input of shape (N, C, ...); got {tuple(x.shape)}")

    def forward(self, x):
        self._check_input_dim(x)
        if (not self.training or not dist.is_initialized()
                or dist.get_world_size(self.group) == 1):
            return super().forward(x)
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
        return _SyncBatchNormFunction.apply(
            x, self.weight, self.bias, self.running_mean if self.track_running_stats else None,
            self.running_var if self.track_running_stats else None, self.eps, self.momentum,
            self.group)

    @classmethod
    def convert(cls, module, group=None):
        """Replace every BatchNorm layer in ``module`` by a SyncBatchNorm with its state."""
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            new = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, group)
            # assign: keep the layer's own tensors (dtype, device), as torch's converter does
            new.load_state_dict(module.state_dict(), assign=True)
            new.train(module.training)
            return new
        for name, child in module.named_children():
            setattr(module, name, cls.convert(child, group))
        return module
