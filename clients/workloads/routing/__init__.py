"""Federated LLM routing ("Federate the Router"): learn which LLM to call for a query from
decentralised, sparse query x model evaluation data. The code both routers share; each router is
registered in its own workload module (``routing_mlp``, ``routing_kmeans``; server side:
``strategies/fed_mlp.py``, ``strategies/fed_kmeans.py``, ``strategies/routing.py``).

Modules, read in this order:

1. ``data``: what a benchmark is (queries with their observed evaluations, clients' coverage) and
   its knobs; ``synthetic``: a synthetic query-model evaluation benchmark (topic clusters with a
   difficulty component, models with capability tiers, per-topic skill and log-spread prices,
   clients with Dirichlet topic mixtures and partial model coverage; true probabilities kept for
   exact regret); ``tables``: a loader for real evaluation tables (``prompt``, ``<model>``,
   ``<model>|total_cost``);
2. routers: ``mlp`` (a shared trunk and per-model accuracy / log-cost heads, masked loss) and
   ``kmeans`` (Lloyd steps as sufficient statistics, per-(cluster, model) tables with shrinkage),
   each with its local steps and the centralised / client-local baselines as plain functions;
3. ``metrics``: the routing rule argmax_m q_m - lambda c_m swept over lambda, the non-decreasing
   convex hull of the accuracy-cost curve, its AUC over a common cost range, normalised between
   the best single-model hull and the oracle, and routing suboptimality from the true
   probabilities;
4. ``federated``: the benchmark of an experiment config and the client logic both routers share.
"""
