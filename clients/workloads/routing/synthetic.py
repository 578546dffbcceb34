"""The synthetic query-model evaluation benchmark: topic clusters with a partly observable
difficulty, models with capability tiers, per-topic skill and log-spread prices, clients with
Dirichlet topic mixtures and partial model coverage; true probabilities kept for exact regret."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowerbed.clients.workloads.routing.data import (
    Benchmark,
    BenchmarkParams,
    RouterData,
    client_topics,
    observe,
    sample_coverage,
    unit,
)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


@dataclass
class SyntheticWorld:
    """The hidden generative model of the synthetic benchmark (topics, models, prices)."""

    centers: np.ndarray  # [T, d]
    hard_dirs: np.ndarray  # [T, d] direction of the observable difficulty
    prompt_len: np.ndarray  # [T] log-length offset of prompts per topic
    skill: np.ndarray  # [M, T]
    price_in: np.ndarray  # [M] $ per token
    price_out: np.ndarray  # [M]
    verbosity: np.ndarray  # [M] mean log output length
    names: list[str]
    spread: float = 0.35
    gamma: float = 0.6
    sharpness: float = 2.0

    @staticmethod
    def create(rng: np.random.Generator, dim: int, topics: int, models: int, specialists: int):
        centers = 3.0 * unit(rng.normal(size=(topics, dim)))
        hard_dirs = unit(rng.normal(size=(topics, dim)))
        tier = np.linspace(0.0, 1.0, models)
        log_span = np.log(30.0 / 0.2)
        price = 0.2e-6 * np.exp(np.clip(tier + 0.15 * rng.normal(size=models), 0, 1) * log_span)
        skill = -0.6 + 2.2 * tier[:, None] + 0.5 * rng.normal(size=(models, topics))
        names = [f"model-{m:02d}" for m in range(models)]
        # cheap specialists (a "code-llama" analogue): low tier, strong on one or two topics
        for s in range(min(specialists, models - 1)):
            m = 1 + s
            for t in rng.choice(topics, size=min(2, topics), replace=False):
                skill[m, t] += 2.0
            names[m] = f"specialist-{s}"
        return SyntheticWorld(
            centers=centers,
            hard_dirs=hard_dirs,
            prompt_len=0.5 * rng.normal(size=topics),
            skill=skill,
            price_in=price,
            price_out=2.0 * price,
            verbosity=5.0 + 0.5 * rng.normal(size=models),
            names=names,
        )

    def queries(
        self,
        topic: np.ndarray,
        rng: np.random.Generator,
        cost_unit: float,
        skill_offset: np.ndarray | None = None,
    ) -> RouterData:
        """Embeddings, true probabilities and one sampled evaluation of every model per query
        (``skill_offset`` [M]: the asking client's shift of every model's skill)."""
        n, dim = len(topic), self.centers.shape[1]
        skill = self.skill if skill_offset is None else self.skill + skill_offset[:, None]
        xi = rng.normal(size=(n, dim))
        emb = unit(self.centers[topic] + self.spread * xi)
        observable = np.einsum("nd,nd->n", xi, self.hard_dirs[topic])
        difficulty = self.gamma * observable + np.sqrt(1 - self.gamma**2) * rng.normal(size=n)
        p_true = _sigmoid(self.sharpness * (skill[:, topic].T - difficulty[:, None]))
        y = (rng.random(p_true.shape) < p_true).astype(np.float32)
        len_in = np.exp(5.0 + self.prompt_len[topic] + 0.3 * rng.normal(size=n))
        log_out = self.verbosity[None, :] + 0.4 * rng.normal(size=(n, len(self.names)))
        cost = self.price_in * len_in[:, None] + self.price_out * np.exp(log_out)
        cost_true = self.price_in * len_in[:, None] + self.price_out * np.exp(self.verbosity + 0.08)
        return RouterData(
            emb=emb.astype(np.float32),
            y=y,
            cost=(cost * cost_unit).astype(np.float32),
            mask=np.ones(p_true.shape, dtype=bool),
            p_true=p_true,
            cost_true=cost_true * cost_unit,
            topic=topic.astype(np.int64),
        )


def make_synthetic_benchmark(params: BenchmarkParams, num_clients: int, alpha: float, seed: int):
    """The synthetic benchmark; a pure function of (params, clients, alpha, seed)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 8008]))
    world = SyntheticWorld.create(rng, params.dim, params.topics, params.models, params.specialists)
    mixtures = client_topics(rng, num_clients, params.topics, alpha)
    prices = world.price_in + world.price_out
    cov = sample_coverage(
        rng, num_clients, prices, params.coverage, params.coverage_bias, params.exclude_models
    )
    offsets = np.zeros((num_clients, params.models))
    if params.client_skill > 0:  # own stream: the other draws stay those of client_skill = 0
        side = np.random.default_rng(np.random.SeedSequence([seed, 8008, 1]))
        offsets = params.client_skill * side.normal(size=offsets.shape)
    train: list[RouterData] = []
    test: list[RouterData] = []
    for k in range(num_clients):
        for n, out in ((params.n_train, train), (params.n_test, test)):
            topic = rng.choice(params.topics, size=n, p=mixtures[k])
            out.append(world.queries(topic, rng, params.cost_unit, offsets[k]))
        train[k] = observe(train[k], cov[k])
    global_topic = rng.choice(params.topics, size=params.n_global_test)
    global_test = world.queries(global_topic, rng, params.cost_unit)
    return Benchmark(train, test, global_test, cov, world.names, mixtures)
