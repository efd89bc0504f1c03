"""Reading container images from outside: a Docker daemon, `docker save` tarballs, OCI layouts.

Modules: ``tarstream`` (bounded streaming tar reader), ``archive`` (docker-save and OCI layouts),
``merge`` (layers applied in order with whiteouts, in a private directory, nothing escapes),
``waste`` (identical content per layer), ``daemon`` (docker SDK), ``audit`` (merge, then the
checks of `rocm-audit check` over the merged view).
"""
