"""natural_rl_env_loop (natural, nothing staged): on-policy RL as CleanRL's ppo.py writes it, with 512 environments:
gym's Acrobot-v1 dynamics (a two-link pendulum, RK4 integration, auto-reset at the goal or after 500 steps) vectorised
in numpy and stepped by the main thread; an actor-critic (two MLPs 6-64-64, tanh, orthogonal init) on the GPU. Each env
step: the observations to the GPU (torch.Tensor(obs).to(device)), the policy's forward, a Categorical's sample, log-prob
and the value under no_grad (the distribution's argument checks on, PyTorch's default), the actions back with
.cpu().numpy(), the env stepped, the rewards and dones to the GPU into the rollout buffers. Every 128 env steps (65,536
transitions) a PPO update: GAE in a Python loop over the 128 steps, then 4 epochs of 4 minibatches (16,384) indexed by a
numpy permutation: the clipped policy loss, the clipped value loss, the entropy bonus, backward, clip_grad_norm_(0.5),
Adam; then the losses, the clip fraction and the explained variance read back for the log. CPUs 2-3, 20 s; steps are env
steps. The script measures itself: the main thread's time stepping the envs, in the policy's forward (with its argument
checks), in the .cpu() of the actions, copying rewards, observations and dones to the GPU, and in the updates; its
schedstat (CPU time and run-queue wait) and the process's minor page faults over the run; and the GPU's own time
(common.gpu_seconds_queued, the argument checks off there: they synchronise) for an env step's policy work, one
minibatch's update and 32 steps of GAE, so that the GPU's busy share is known."""

import math
import os
import threading
import time

import numpy as np

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_rl_env_loop", "natural", "PPO on 512 numpy Acrobot envs stepped by the main thread, a small "
              "actor-critic on the GPU, actions read back with .cpu() every env step, an update every 128 steps, "
              "20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributions import Categorical, Distribution  # noqa: E402

device = torch.device(sc.device)
NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES = 512, 128, 4, 4
BATCH_SIZE = NUM_ENVS * NUM_STEPS
MB_SIZE = BATCH_SIZE // MINIBATCHES
GAMMA, GAE_LAMBDA, CLIP, ENT_COEF, VF_COEF, MAX_GRAD = 0.99, 0.95, 0.2, 0.01, 0.5, 0.5
OBS_DIM, N_ACTIONS = 6, 3


class VecAcrobot:
    """gym's Acrobot-v1 ("book" dynamics), N copies stepped at once in numpy, each reset when it ends."""

    DT, L1, M1, M2, LC1, LC2, I1, I2, G = 0.2, 1.0, 1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 9.8
    MAX_VEL_1, MAX_VEL_2, MAX_STEPS = 4 * math.pi, 9 * math.pi, 500
    TORQUES = np.array([-1.0, 0.0, 1.0])

    def __init__(self, n: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.s = self.rng.uniform(-0.1, 0.1, (n, 4))
        self.t = np.zeros(n, np.int64)
        self.ret = np.zeros(n)
        self.finished: list[float] = []

    def _dsdt(self, s: np.ndarray, a: np.ndarray) -> np.ndarray:
        m1, m2, l1, lc1, lc2, i1, i2, g = self.M1, self.M2, self.L1, self.LC1, self.LC2, self.I1, self.I2, self.G
        th1, th2, dth1, dth2 = s[:, 0], s[:, 1], s[:, 2], s[:, 3]
        d1 = m1 * lc1 ** 2 + m2 * (l1 ** 2 + lc2 ** 2 + 2 * l1 * lc2 * np.cos(th2)) + i1 + i2
        d2 = m2 * (lc2 ** 2 + l1 * lc2 * np.cos(th2)) + i2
        phi2 = m2 * lc2 * g * np.cos(th1 + th2 - math.pi / 2)
        phi1 = (-m2 * l1 * lc2 * dth2 ** 2 * np.sin(th2) - 2 * m2 * l1 * lc2 * dth2 * dth1 * np.sin(th2)
                + (m1 * lc1 + m2 * l1) * g * np.cos(th1 - math.pi / 2) + phi2)
        ddth2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dth1 ** 2 * np.sin(th2) - phi2) / (m2 * lc2 ** 2 + i2
                                                                                         - d2 ** 2 / d1)
        ddth1 = -(d2 * ddth2 + phi1) / d1
        return np.stack([dth1, dth2, ddth1, ddth2], axis=1)

    def obs(self) -> np.ndarray:
        s = self.s
        return np.stack([np.cos(s[:, 0]), np.sin(s[:, 0]), np.cos(s[:, 1]), np.sin(s[:, 1]), s[:, 2], s[:, 3]],
                        axis=1).astype(np.float32)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, s, dt = self.TORQUES[actions], self.s, self.DT
        k1 = self._dsdt(s, a)
        k2 = self._dsdt(s + dt / 2 * k1, a)
        k3 = self._dsdt(s + dt / 2 * k2, a)
        k4 = self._dsdt(s + dt * k3, a)
        s = s + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        s[:, :2] = (s[:, :2] + math.pi) % (2 * math.pi) - math.pi
        s[:, 2] = np.clip(s[:, 2], -self.MAX_VEL_1, self.MAX_VEL_1)
        s[:, 3] = np.clip(s[:, 3], -self.MAX_VEL_2, self.MAX_VEL_2)
        self.s, self.t = s, self.t + 1
        terminated = -np.cos(s[:, 0]) - np.cos(s[:, 1] + s[:, 0]) > 1.0
        done = terminated | (self.t >= self.MAX_STEPS)
        reward = np.where(terminated, 0.0, -1.0)
        self.ret += reward
        if done.any():
            self.finished.extend(self.ret[done].tolist())
            self.ret[done] = 0.0
            self.t[done] = 0
            self.s[done] = self.rng.uniform(-0.1, 0.1, (int(done.sum()), 4))
        return self.obs(), reward, done


def layer(i: int, o: int, std: float = 2 ** 0.5) -> nn.Linear:
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, 0.0)
    return lin


class Agent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.critic = nn.Sequential(layer(OBS_DIM, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
        self.actor = nn.Sequential(layer(OBS_DIM, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                                   layer(64, N_ACTIONS, 0.01))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


torch.manual_seed(1)
np.random.seed(1)
envs = VecAcrobot(NUM_ENVS, seed=1)
agent = Agent().to(device)
optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
obs = torch.zeros((NUM_STEPS, NUM_ENVS, OBS_DIM), device=device)
actions = torch.zeros((NUM_STEPS, NUM_ENVS), device=device)
logprobs = torch.zeros((NUM_STEPS, NUM_ENVS), device=device)
rewards = torch.zeros((NUM_STEPS, NUM_ENVS), device=device)
dones = torch.zeros((NUM_STEPS, NUM_ENVS), device=device)
values = torch.zeros((NUM_STEPS, NUM_ENVS), device=device)
next_obs = torch.Tensor(envs.obs()).to(device)
next_done = torch.zeros(NUM_ENVS, device=device)
own = {"env_steps": 0, "updates": 0, "env_s": 0.0, "policy_s": 0.0, "readback_s": 0.0, "to_gpu_s": 0.0,
       "update_s": 0.0, "gae_s": 0.0}
state = {"t": 0, "log": {}}


def env_step() -> None:
    """One step of the 512 envs (and, after each 128th, the update)."""
    global next_obs, next_done
    t = state["t"]
    t0 = time.perf_counter()
    obs[t] = next_obs
    dones[t] = next_done
    with torch.no_grad():
        action, logprob, _, value = agent.get_action_and_value(next_obs)
        values[t] = value.flatten()
    actions[t] = action
    logprobs[t] = logprob
    t1 = time.perf_counter()
    a = action.cpu().numpy()
    t2 = time.perf_counter()
    next_obs_np, reward, done = envs.step(a)
    t3 = time.perf_counter()
    rewards[t] = torch.tensor(reward).to(device).view(-1)
    next_obs, next_done = torch.Tensor(next_obs_np).to(device), torch.Tensor(done).to(device)
    t4 = time.perf_counter()
    own["policy_s"] += t1 - t0
    own["readback_s"] += t2 - t1
    own["env_s"] += t3 - t2
    own["to_gpu_s"] += t4 - t3
    own["env_steps"] += 1
    state["t"] = t + 1
    if state["t"] == NUM_STEPS:
        state["t"] = 0
        u0 = time.perf_counter()
        update()
        own["update_s"] += time.perf_counter() - u0
        own["updates"] += 1


def gae(advantages: torch.Tensor, next_value: torch.Tensor, steps: range) -> None:
    lastgaelam = 0
    for t in reversed(steps):
        if t == NUM_STEPS - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + GAMMA * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + GAMMA * GAE_LAMBDA * nextnonterminal * lastgaelam


def minibatch_loss(b: dict, mb_inds) -> tuple[torch.Tensor, ...]:
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b["obs"][mb_inds], b["actions"].long()[mb_inds])
    logratio = newlogprob - b["logprobs"][mb_inds]
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > CLIP).float().mean()
    mb_adv = b["advantages"][mb_inds]
    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
    pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP)).mean()
    newvalue = newvalue.view(-1)
    v_unclipped = (newvalue - b["returns"][mb_inds]) ** 2
    v_clipped = b["values"][mb_inds] + torch.clamp(newvalue - b["values"][mb_inds], -CLIP, CLIP)
    v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b["returns"][mb_inds]) ** 2).mean()
    loss = pg_loss - ENT_COEF * entropy.mean() + v_loss * VF_COEF
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD)
    optimizer.step()
    return pg_loss, v_loss, approx_kl, clipfrac


def flat(advantages: torch.Tensor) -> dict:
    returns = advantages + values
    return {"obs": obs.reshape(-1, OBS_DIM), "logprobs": logprobs.reshape(-1), "actions": actions.reshape(-1),
            "advantages": advantages.reshape(-1), "returns": returns.reshape(-1), "values": values.reshape(-1)}


def update() -> None:
    g0 = time.perf_counter()
    with torch.no_grad():
        next_value = agent.get_value(next_obs).reshape(1, -1)
        advantages = torch.zeros_like(rewards)
        gae(advantages, next_value, range(NUM_STEPS))
    own["gae_s"] += time.perf_counter() - g0
    b = flat(advantages)
    b_inds = np.arange(BATCH_SIZE)
    clipfracs = []
    for _ in range(EPOCHS):
        np.random.shuffle(b_inds)
        for start in range(0, BATCH_SIZE, MB_SIZE):
            pg_loss, v_loss, approx_kl, clipfrac = minibatch_loss(b, b_inds[start:start + MB_SIZE])
            clipfracs.append(clipfrac.item())
    y_pred, y_true = b["values"].cpu().numpy(), b["returns"].cpu().numpy()
    var_y = np.var(y_true)
    state["log"] = {"pg_loss": pg_loss.item(), "v_loss": v_loss.item(), "approx_kl": approx_kl.item(),
                    "clipfrac": float(np.mean(clipfracs)),
                    "explained_var": float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)}


def measure_gpu() -> dict:
    """The GPU's time for an env step's policy work, a minibatch's update and 32 steps of GAE, each queued behind a
    spin kernel (the distributions' argument checks off: they synchronise)."""
    def median(work, prepare=None) -> float | None:
        runs = sorted(r for r in (gpu_seconds_queued(torch, work, prepare) for _ in range(5)) if r is not None)
        return runs[len(runs) // 2] if runs else None

    default = Distribution._validate_args
    Distribution.set_default_validate_args(False)
    try:
        def policy(_) -> None:
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[0] = value.flatten()
            actions[0] = action
            logprobs[0] = logprob

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
        advantages = torch.zeros_like(rewards)
        b = flat(advantages)
        mb = torch.randperm(BATCH_SIZE, device=device)[:MB_SIZE]
        got = {"policy": median(policy),
               "minibatch": median(lambda _: minibatch_loss(b, mb)),
               "gae32": median(lambda _: gae(advantages, next_value, range(NUM_STEPS - 32, NUM_STEPS)))}
    finally:
        Distribution.set_default_validate_args(default)
    return got


for _ in range(2 * NUM_STEPS):  # two rollouts and updates
    env_step()
gpu = None
if sc.cuda:
    torch.cuda.synchronize()
    gpu = measure_gpu()
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    env_step()
if sc.cuda:
    torch.cuda.synchronize()
for k in own:
    own[k] = 0 if k in ("env_steps", "updates") else 0.0
episodes0 = len(envs.finished)
STAT = f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat"
run0, wait0 = (int(v) for v in open(STAT).read().split()[:2])
flt0 = int(open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[7])
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, env_step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, env_step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
run1, wait1 = (int(v) for v in open(STAT).read().split()[:2])
flt1 = int(open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[7])
main_run, main_wait = round((run1 - run0) / 1e9, 4), round((wait1 - wait0) / 1e9, 4)
n, nu = own["env_steps"], own["updates"]
gpu_busy = None
if gpu and all(v is not None for v in gpu.values()):
    update_gpu = gpu["gae32"] * NUM_STEPS / 32 + gpu["minibatch"] * EPOCHS * MINIBATCHES
    gpu_busy = n * gpu["policy"] + nu * update_gpu
finished = envs.finished[episodes0:]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "env_steps_per_s": round(n / wall, 2), "transitions_per_s": round(n * NUM_ENVS / wall, 1),
                    "env_share": share(own["env_s"]), "policy_share": share(own["policy_s"]),
                    "readback_share": share(own["readback_s"]), "to_gpu_share": share(own["to_gpu_s"]),
                    "update_share": share(own["update_s"]), "gae_share": share(own["gae_s"]),
                    "policy_with_readback_share": share(own["policy_s"] + own["readback_s"]),
                    "main_run_s": main_run, "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "minor_faults_per_s": round((flt1 - flt0) / wall, 1),
                    "gpu_policy_ms": round(gpu["policy"] * 1e3, 4) if gpu and gpu["policy"] else None,
                    "gpu_minibatch_ms": round(gpu["minibatch"] * 1e3, 4) if gpu and gpu["minibatch"] else None,
                    "gpu_gae32_ms": round(gpu["gae32"] * 1e3, 4) if gpu and gpu["gae32"] else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy) if gpu_busy is not None else None,
                    "num_envs": NUM_ENVS, "num_steps": NUM_STEPS, "epochs": EPOCHS, "minibatches": MINIBATCHES,
                    "validate_args": bool(Distribution._validate_args), "episodes": len(finished),
                    "mean_return": round(float(np.mean(finished)), 2) if finished else None, **state["log"]}
sc.note(f"natural: measured by the script: {n} env steps of {NUM_ENVS} envs ({n / wall:.0f}/s) and {nu} updates in "
        f"{wall:.2f} s: {own['env_s']:.2f} s stepping the envs (numpy), {own['policy_s']:.2f} s in the policy's "
        f"forward, {own['readback_s']:.2f} s in the actions' .cpu(), {own['to_gpu_s']:.2f} s copying rewards, "
        f"observations and dones to the GPU, {own['update_s']:.2f} s in updates (GAE {own['gae_s']:.2f} s); "
        + (f"the GPU busy {gpu_busy / wall:.1%} of the run (its kernels' time queued)." if gpu_busy is not None
           else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
