"""Diagnosis of any trainer without instrumentation: where its time goes and the lines that cost it.

``phases``: global torch hooks and gymnasium/autograd wrappers that split wall time into env,
inference, update, transfer and other; ``host_syncs``: device->host synchronisations by kind and
source line; ``float64_sites``: float64/complex128 work by op and source line; ``loop_shape``:
forwards and kernels per env step, the optimizer's implementation, threads, compile counters;
``recommendations``: the rules table (finding -> optimisation, reference figure, check);
``report``: the readable report. ``harness.analyses.diagnose`` runs them on a trainer.
"""
