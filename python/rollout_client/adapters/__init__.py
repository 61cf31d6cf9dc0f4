"""Adapters that drop the rollout service into RL trainers, one module per trainer, each importing only its trainer:

- ``rollout_client.adapters.verl``    — verl 0.9.1 agent loop (``@register("rollout_service")``)
- ``rollout_client.adapters.skyrl``   — SkyRL 0.4.0 ``GeneratorInterface``
- ``rollout_client.adapters.nemo_rl`` — NeMo-RL: the NeMo Gym actor's ``run_rollouts``
- ``rollout_client.adapters.slime``   — slime custom generate function and rollout function

See docs/trainers/ for each recipe. Nothing is imported here, so importing one adapter never needs another trainer.
"""
