"""verl's ``TrainingWorker`` (actor, reference, critic engine host) made to run on the CPU platform too."""

import torch.distributed
from verl.utils.device import get_device_name
from verl.workers.engine_workers import TrainingWorker as VerlTrainingWorker

from verl_ext.workers.engines import register_cpu_engines


class TrainingWorker(VerlTrainingWorker):
    def __init__(self, config):
        if get_device_name() == "cpu":
            register_cpu_engines()
            # verl would ask for "cpu:gloo,cpu:gloo", which torch rejects as a duplicate device type.
            if not torch.distributed.is_initialized():
                torch.distributed.init_process_group(backend="gloo")
        super().__init__(config)
