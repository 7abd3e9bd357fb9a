"""Federated data: flat client pools, partitioners, offline sources and dataset builders."""

from fedjax_sel.data.federated import (ClientPool, FederatedDataset, device_pool, label_histogram,
                                       split_clients)
from fedjax_sel.data.partition import PARTITIONS

__all__ = [
    "ClientPool", "FederatedDataset", "device_pool", "label_histogram", "split_clients",
    "PARTITIONS",
]
