import pytest
import ray
import transfer_queue as tq
from omegaconf import OmegaConf


@pytest.fixture(scope="module")
def transfer_queue_cluster():
    """A local Ray cluster with TransferQueue on it (SimpleStorage; two storage units, where the CPU recipes run one:
    a batch's samples split across units, as on a cluster), a module's tests at a time."""
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 2}}}))
    yield
    tq.close()
    ray.shutdown()
