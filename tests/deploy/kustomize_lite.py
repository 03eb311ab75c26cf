"""A small kustomize renderer for the subset of kustomize that deploy/k8s uses, so the manifests
are rendered and validated where no `kustomize` binary exists.

Covered: `resources` (files and directories with a kustomization.yaml), `namespace`, `labels`
(metadata only: includeSelectors/includeTemplates false), `configMapGenerator` and
`secretGenerator` (`files`, `literals`, `options.labels`; behavior create/replace/merge; kustomize's name-hash suffix
and the references to it in pod specs), `images` (newName/newTag), `replicas`, and `patches` given as
strategic-merge-patch files (maps merge, null deletes a key, the lists containers, initContainers,
env and volumes merge by name and volumeMounts by mountPath, the patch's items first; other lists
are replaced).
Not covered (an error, never ignored): every other kustomization field, JSON 6902 patches,
`$patch` directives, namePrefix/nameSuffix. tests/deploy/test_k8s.py checks the output against
`kubectl kustomize` where kubectl is installed.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

SUPPORTED_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "images",
    "replicas",
    "patches",
}
# Strategic-merge keys of the lists we patch (from the Kubernetes API's patchMergeKey markers).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
}
POD_OWNERS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PersistentVolume",
    "StorageClass",
    "CustomResourceDefinition",
}

Resource = dict[str, Any]


class KustomizeError(ValueError):
    """The kustomization uses something this renderer does not cover, or is inconsistent."""


def render(directory: Path) -> list[Resource]:
    """Render the kustomization in `directory` to a list of resources."""
    resources = _render(Path(directory))
    _apply_hash_names(resources)  # last, as kustomize does: overlays address generated objects by name
    return resources


def _render(directory: Path) -> list[Resource]:
    kfile = directory / "kustomization.yaml"
    if not kfile.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    kust = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(kust) - SUPPORTED_FIELDS
    if unknown:
        raise KustomizeError(f"{kfile}: fields not covered by kustomize_lite: {sorted(unknown)}")

    resources: list[Resource] = []
    for entry in kust.get("resources", []):
        path = directory / entry
        resources += _render(path) if path.is_dir() else _load_docs(path)

    hash_names = not (kust.get("generatorOptions") or {}).get("disableNameSuffixHash", False)
    for spec in kust.get("configMapGenerator", []):
        _generate(resources, directory, spec, "ConfigMap", hash_names)
    for spec in kust.get("secretGenerator", []):
        _generate(resources, directory, spec, "Secret", hash_names)

    for patch in kust.get("patches", []):
        if set(patch) != {"path"}:
            raise KustomizeError(f"{kfile}: only `patches: - path: FILE` (strategic merge) is covered")
        for doc in _load_docs(directory / patch["path"]):
            target = _find(resources, doc["kind"], doc["metadata"]["name"])
            merged = strategic_merge(copy.deepcopy(target), doc)
            target.clear()
            target.update(merged)
    for rep in kust.get("replicas", []):
        matches = [r for r in resources if r["metadata"]["name"] == rep["name"] and "replicas" in r.get("spec", {})]
        if not matches:
            raise KustomizeError(f"{kfile}: replicas: no workload named {rep['name']}")
        for r in matches:
            r["spec"]["replicas"] = rep["count"]
    for image in kust.get("images", []):
        for container in _containers(resources):
            name, _, tag = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    for label in kust.get("labels", []):
        if label.get("includeSelectors") or label.get("includeTemplates"):
            raise KustomizeError(f"{kfile}: labels with includeSelectors/includeTemplates are not covered")
        for r in resources:
            r["metadata"].setdefault("labels", {}).update(label["pairs"])
    if "namespace" in kust:
        for r in resources:
            if r["kind"] not in CLUSTER_SCOPED:
                r["metadata"]["namespace"] = kust["namespace"]
    return resources


def _load_docs(path: Path) -> list[Resource]:
    return [d for d in yaml.safe_load_all(Path(path).read_text()) if d]


def _find(resources: list[Resource], kind: str, name: str) -> Resource:
    for r in resources:
        if r["kind"] == kind and r["metadata"]["name"] == name:
            return r
    raise KustomizeError(f"no {kind} named {name} to patch")


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """Merge `patch` into `base` (both plain YAML values) the strategic-merge way, for our subset."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if k.startswith("$"):
                raise KustomizeError(f"patch directive {k} is not covered")
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge(out[k], v, k)
            else:
                out[k] = v
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        # kustomize's order (checked against `kubectl kustomize`): the patch's items first, in its
        # order (merged into the base's item of the same key), then the base's other items
        mkey = MERGE_KEYS[key]
        by_key = {b.get(mkey): b for b in base}
        patched = [strategic_merge(by_key[i.get(mkey)], i) if i.get(mkey) in by_key else i for i in patch]
        keys = {i.get(mkey) for i in patch}
        return patched + [b for b in base if b.get(mkey) not in keys]
    return patch


def _generate(resources: list[Resource], directory: Path, spec: dict, kind: str, hash_names: bool) -> None:
    data: dict[str, str] = {}
    for entry in spec.get("files", []):
        key, sep, rel = entry.partition("=")
        path = directory / (rel if sep else key)
        if not sep:
            key = Path(key).name
        if not path.is_file():
            raise KustomizeError(f"{kind} generator {spec['name']}: missing file {path}")
        data[key] = path.read_text()
    for entry in spec.get("literals", []):
        key, _, value = entry.partition("=")
        data[key] = value
    unknown = (set(spec) - {"name", "files", "literals", "behavior", "type", "options"}) | {
        f"options.{k}" for k in set(spec.get("options") or {}) - {"labels"}
    }
    if unknown:
        raise KustomizeError(f"{kind} generator {spec['name']}: fields not covered: {sorted(unknown)}")
    labels = (spec.get("options") or {}).get("labels")
    behavior = spec.get("behavior", "create")
    if kind == "Secret":
        data = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    existing = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == spec["name"]]
    if behavior == "create":
        if existing:
            raise KustomizeError(f"{kind} {spec['name']} already exists: use behavior replace or merge")
        res: Resource = {"apiVersion": "v1", "kind": kind, "metadata": {"name": spec["name"]}, "data": data}
        if kind == "Secret":
            res["type"] = spec.get("type", "Opaque")
        res["metadata"]["annotations"] = {"__hash_name__": str(hash_names)}
        if labels:
            res["metadata"]["labels"] = dict(labels)
        resources.append(res)
        return
    if not existing:
        raise KustomizeError(f"{kind} {spec['name']}: behavior {behavior} needs one from a base")
    target = existing[0]
    target["data"] = data if behavior == "replace" else {**target["data"], **data}


def kustomize_hash(resource: Resource) -> str:
    """kustomize's content hash of a generated ConfigMap/Secret (api/hasher): sha256 of Go's JSON of
    kind, name, data (and type), first 10 hex digits with 0,1,3,a,e replaced so no bad words form.
    The name is always "": kustomize looks it up as one field called "metadata/name", which no
    object has (checked against `kubectl kustomize` 5.5 by tests/deploy/test_k8s.py)."""
    fields: dict[str, Any] = {"kind": resource["kind"], "name": "", "data": resource["data"]}
    if resource["kind"] == "Secret":
        fields["type"] = resource["type"]
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")  # Go's HTML-safe JSON
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans({"0": "g", "1": "h", "3": "k", "a": "m", "e": "t"}))


def _apply_hash_names(resources: list[Resource]) -> None:
    renamed: dict[tuple[str, str], str] = {}
    for r in resources:
        annotations = r["metadata"].get("annotations", {})
        if "__hash_name__" in annotations:
            hashed = annotations.pop("__hash_name__") == "True"
            if not annotations:
                del r["metadata"]["annotations"]
            if hashed:
                new = f"{r['metadata']['name']}-{kustomize_hash(r)}"
                renamed[(r["kind"], r["metadata"]["name"])] = new
                r["metadata"]["name"] = new
    for spec in _pod_specs(resources):
        for vol in spec.get("volumes", []):
            if "configMap" in vol:
                vol["configMap"]["name"] = renamed.get(
                    ("ConfigMap", vol["configMap"]["name"]), vol["configMap"]["name"]
                )
            if "secret" in vol:
                vol["secret"]["secretName"] = renamed.get(
                    ("Secret", vol["secret"]["secretName"]), vol["secret"]["secretName"]
                )
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            for env in c.get("env", []):
                ref = env.get("valueFrom", {})
                for field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                    if field in ref:
                        ref[field]["name"] = renamed.get((kind, ref[field]["name"]), ref[field]["name"])
            for src in c.get("envFrom", []):
                for field, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
                    if field in src:
                        src[field]["name"] = renamed.get((kind, src[field]["name"]), src[field]["name"])


def _pod_specs(resources: list[Resource]) -> list[dict]:
    return [r["spec"]["template"]["spec"] for r in resources if r["kind"] in POD_OWNERS]


def _containers(resources: list[Resource]) -> list[dict]:
    return [c for spec in _pod_specs(resources) for c in spec.get("containers", []) + spec.get("initContainers", [])]
