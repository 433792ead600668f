"""Federated LoRA fine-tuning (FedAvg on ``peft`` adapters): the baseline DQ's text runs face."""
