"""The StarSD operator: reconciles a ``StarSDCluster`` into a draft and per-pool targets, and rebalances them.

Layout (pure logic first, the Kubernetes edge last):

* :mod:`.spec` parses a custom resource's spec into typed, defaulted values.
* :mod:`.naming` holds child names, labels and selectors; :mod:`.podspec`, :mod:`.draft`, :mod:`.targets`
  and :mod:`.network` build child resources as plain dicts; :mod:`.children` lists them all.
* :mod:`.pools` splits the target count across node pools by weight within each pool's bounds.
* :mod:`.diagnose`, :mod:`.conditions` and :mod:`.status` turn observed children into ``status``.
* :mod:`.rebalancer` is the pure decision function; :mod:`.loadclient` reads the draft's ``/v1/load``.
* :mod:`.kube` is the only module that talks to the API server; :mod:`.controller` orchestrates one
  reconcile or one periodic tick; :mod:`.handlers` and :mod:`.main` register them with kopf.
"""
