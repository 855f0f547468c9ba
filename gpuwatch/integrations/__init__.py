"""Framework integrations: each sends the model facts and the phases the framework knows.

- :mod:`gpuwatch.integrations.transformers`: ``Trainer(..., callbacks=[GpuwatchCallback()])``
- :mod:`gpuwatch.integrations.lightning`: ``L.Trainer(callbacks=[GpuwatchCallback()])``
- :mod:`gpuwatch.integrations.accelerate`: ``gpuwatch.integrations.accelerate.watch(accelerator)``

Each module imports without its framework installed; using it then raises an ImportError
that says what to install. Under ``gpuwatch run`` none is needed for the phases (the
start-up hook infers them); they add what only the framework knows: the step number it
counts, its precision, evaluation results and checkpoints as marks.
"""
