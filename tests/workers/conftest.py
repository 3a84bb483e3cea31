import os

import pytest
import ray
import torch
import transfer_queue as tq
from engine_testing import init_single_process_group
from omegaconf import OmegaConf


@pytest.fixture(scope="module")
def gloo():
    """A one-rank gloo group for verl's FSDP engine in this process, verl's worker env restored after the module."""
    with pytest.MonkeyPatch.context() as env:
        for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.setenv(key, os.environ.get(key, ""))  # restored after the module
        init_single_process_group()
        torch.set_num_threads(1)  # tiny matrices: threads cost more than they give on a shared box
        yield


@pytest.fixture(scope="module")
def transfer_queue_cluster():
    """A local Ray cluster with TransferQueue on it (SimpleStorage; two storage units, where the CPU recipes run one:
    a batch's samples split across units, as on a cluster), a module's tests at a time."""
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 2}}}))
    yield
    tq.close()
    ray.shutdown()
