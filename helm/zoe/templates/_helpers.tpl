{{/* Names, labels and the one pod template per component. */}}

{{- define "zoe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "zoe.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains (include "zoe.name" .) .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "zoe.name" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "zoe.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "zoe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
zoe.dev/model: {{ .Values.model.name }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "router"). */}}
{{- define "zoe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "zoe.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "zoe.componentLabels" -}}
{{ include "zoe.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "zoe.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "zoe.headImage" -}}
{{- $h := .Values.rayCluster.head.image -}}
{{- printf "%s:%s" (default .Values.image.repository $h.repository) (default (default .Chart.AppVersion .Values.image.tag) $h.tag) -}}
{{- end -}}

{{/* The engine the deployment's recipe variants run on: model.variant's, else the one engine of all the model's
variants (zoe.recipes, generated from the recipes). The worker image must carry it, simulated replicas included. */}}
{{- define "zoe.recipeEngine" -}}
{{- $m := .Values.model -}}
{{- $variants := get (include "zoe.recipes" . | fromJson) $m.name -}}
{{- if $m.variant -}}
{{- (get $variants $m.variant).engine -}}
{{- else -}}
{{- $engines := list -}}
{{- range $variants }}{{ $engines = append $engines .engine }}{{ end -}}
{{- $engines = $engines | uniq | sortAlpha -}}
{{- if ne (len $engines) 1 -}}
{{- fail (printf "model %s has variants on %s: set model.variant, so that the chart knows which engine's worker image to run" $m.name (join " and " $engines)) -}}
{{- end -}}
{{- first $engines -}}
{{- end -}}
{{- end -}}

{{/* GPUs one replica takes: model.variant's, else the most any of the model's variants takes. */}}
{{- define "zoe.replicaGpus" -}}
{{- $m := .Values.model -}}
{{- $variants := get (include "zoe.recipes" . | fromJson) $m.name -}}
{{- $most := 0 -}}
{{- range $name, $v := $variants -}}
{{- if or (not $m.variant) (eq $name $m.variant) }}{{ $most = max $most (int $v.gpus) }}{{ end -}}
{{- end -}}
{{- $most -}}
{{- end -}}

{{/* `ray start` parameters of the head. Simulated replicas run on the head when there are no GPU workers; they
keep their variant's GPU count for placement, so the head then declares that many (fake) GPUs. */}}
{{- define "zoe.headRayStartParams" -}}
{{- $params := deepCopy .Values.rayCluster.head.rayStartParams -}}
{{- if and (eq (include "zoe.engine" .) "sim") (lt (int .Values.rayCluster.worker.replicas) 1) -}}
{{- $_ := set $params "num-gpus" (toString (mul (int .Values.model.replicas) (int (include "zoe.replicaGpus" .)))) -}}
{{- end -}}
{{- toYaml $params -}}
{{- end -}}

{{/* The engine `zoe deploy` runs: model.engine (sim, or the recipe's own), else the recipe's. */}}
{{- define "zoe.engine" -}}
{{- default (include "zoe.recipeEngine" .) .Values.model.engine -}}
{{- end -}}

{{/* The worker images the deployment can use, as a JSON list of names (zoe.workerImages): those of model.variant and
switching.candidates, or, when the planner picks the variant inside the RayJob, those of every variant of the model.
One worker group runs one image, so each of these gets its own group. */}}
{{- define "zoe.deploymentImages" -}}
{{- $m := .Values.model -}}
{{- $variants := get (include "zoe.recipes" . | fromJson) $m.name -}}
{{- $images := list -}}
{{- range $name, $v := $variants -}}
{{- if or (not $m.variant) (eq $name $m.variant) (has $name $.Values.switching.candidates) }}{{ $images = append $images $v.image }}{{ end -}}
{{- end -}}
{{- $images | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* Worker nodes of the group of one worker image (dict "ctx" $ "image" NAME): rayCluster.worker.replicasByImage's
count for it, else rayCluster.worker.replicas. */}}
{{- define "zoe.imageReplicas" -}}
{{- $w := .ctx.Values.rayCluster.worker -}}
{{- if hasKey $w.replicasByImage .image }}{{ int (get $w.replicasByImage .image) }}{{ else }}{{ int $w.replicas }}{{ end -}}
{{- end -}}

{{/* The repository:tag of one worker image (dict "ctx" $ "image" NAME); a repository named for another worker image
(zoe-vllm-rocm for the SGLang image) fails the render. */}}
{{- define "zoe.workerImage" -}}
{{- $w := .ctx.Values.rayCluster.worker.image -}}
{{- $known := include "zoe.workerImages" .ctx | fromJson -}}
{{- $repo := get $w.repositories .image -}}
{{- $base := last (splitList "/" $repo) -}}
{{- if and (hasKey $known $base) (ne $base .image) -}}
{{- $want := get $known .image -}}
{{- $other := get $known $base -}}
{{- fail (printf "%s's variants run in worker image %s (%s, FROM %s), but rayCluster.worker.image.repositories.%s is %s, the image %s (%s, FROM %s): name the %s image there" .ctx.Values.model.name .image $want.engine $want.base .image $repo $base $other.engine $other.base .image) -}}
{{- end -}}
{{- printf "%s:%s" $repo (default (default .ctx.Chart.AppVersion .ctx.Values.image.tag) $w.tag) -}}
{{- end -}}

{{/* The name of the worker group of one worker image (dict "ctx" $ "image" NAME), e.g. mi355x-vllm-rocm-nightly. */}}
{{- define "zoe.workerGroupName" -}}
{{- printf "%s-%s" .ctx.Values.rayCluster.worker.groupName (trimPrefix "zoe-" .image) -}}
{{- end -}}

{{/* The RayCluster group of one worker image (dict "ctx" $ "image" NAME): its name, nodes and `ray start` parameters.
Every node of the group advertises the Ray resource zoe-image/NAME (placement.image_resource), which the bundles of a
replica of a variant of that image ask for (`zoe deploy --image-resource`). */}}
{{- define "zoe.workerGroup" -}}
{{- $w := .ctx.Values.rayCluster.worker -}}
{{- $n := int (include "zoe.imageReplicas" .) -}}
{{- $resources := merge (dict (printf "zoe-image/%s" .image) 1) $w.customResources -}}
groupName: {{ include "zoe.workerGroupName" . }}
replicas: {{ $n }}
minReplicas: {{ $n }}
maxReplicas: {{ $n }}
rayStartParams:
  num-gpus: {{ $w.gpusPerNode | quote }}
  {{- /* KubeRay passes the value to `ray start --resources=` through a shell: JSON inside double quotes */}}
  resources: {{ printf "%q" (toJson $resources) | quote }}
  {{- with (omit $w.rayStartParams "num-gpus") }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
template:
  {{- include "zoe.rayWorkerPodTemplate" . | nindent 2 }}
{{- end -}}

{{- define "zoe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "zoe.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "zoe.rayClusterName" -}}
{{- default (printf "%s-ray" (include "zoe.fullname" .)) .Values.rayCluster.existingCluster -}}
{{- end -}}

{{- define "zoe.secretName" -}}
{{- default (printf "%s-auth" (include "zoe.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "zoe.routerSelector" -}}
{{- printf "app.kubernetes.io/instance=%s,app.kubernetes.io/component=router" .Release.Name -}}
{{- end -}}

{{/* Environment every zoe process in the release shares: where it runs and how to find its peers
through the Kubernetes API (zoe_cluster.k8s reads these). */}}
{{- define "zoe.commonEnv" -}}
- name: ZOE_K8S_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: ZOE_K8S_RELEASE
  value: {{ .Release.Name | quote }}
- name: ZOE_K8S_ROUTER_SELECTOR
  value: {{ include "zoe.routerSelector" . | quote }}
- name: ZOE_K8S_ROUTER_PORT
  value: {{ .Values.router.port | quote }}
- name: ZOE_ROUTER_ADMIN_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "zoe.secretName" . }}
      key: {{ .Values.auth.adminTokenKey }}
- name: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
  value: "0"
{{- end -}}

{{- define "zoe.podCommon" -}}
serviceAccountName: {{ include "zoe.serviceAccountName" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "zoe.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* ---------- Pod template: Ray head (runs the GCS and zoe's controller actor; no GPUs). ---------- */}}
{{- define "zoe.rayHeadPodTemplate" -}}
{{- $head := .Values.rayCluster.head -}}
metadata:
  labels:
    {{- include "zoe.componentLabels" (dict "ctx" . "component" "ray-head") | nindent 4 }}
  {{- with $head.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- include "zoe.podCommon" . | nindent 2 }}
  {{- with (include "zoe.placement" $head) }}{{ . | nindent 2 }}{{ end }}
  containers:
    - name: ray-head
      image: {{ include "zoe.headImage" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      ports:
        - {name: gcs, containerPort: 6379}
        - {name: dashboard, containerPort: 8265}
        - {name: client, containerPort: {{ .Values.rayCluster.clientPort }}}
        - {name: ray-metrics, containerPort: 8080}
      env:
        {{- include "zoe.commonEnv" . | nindent 8 }}
        {{- with $head.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      resources:
        {{- toYaml $head.resources | nindent 8 }}
{{- end -}}

{{/* ---------- Pod template: MI355X worker of one worker image (dict "ctx" $ "image" NAME): 8 GPUs, /dev/shm, host
IPC; engines run here. ---------- */}}
{{- define "zoe.rayWorkerPodTemplate" -}}
{{- $ctx := .ctx -}}
{{- $w := $ctx.Values.rayCluster.worker -}}
metadata:
  labels:
    {{- include "zoe.componentLabels" (dict "ctx" $ctx "component" "ray-worker") | nindent 4 }}
    zoe.dev/worker-group: {{ include "zoe.workerGroupName" . }}
    zoe.dev/worker-image: {{ .image }}
  {{- with $w.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- include "zoe.podCommon" $ctx | nindent 2 }}
  {{- with (include "zoe.placement" $w) }}{{ . | nindent 2 }}{{ end }}
  hostIPC: {{ $w.hostIPC }}
  {{- if $w.hostNetwork }}
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  {{- end }}
  containers:
    - name: ray-worker
      image: {{ include "zoe.workerImage" . }}
      imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
      ports:
        - {name: ray-metrics, containerPort: 8080}
        - {name: engine, containerPort: {{ $w.enginePort }}}
      env:
        {{- include "zoe.commonEnv" $ctx | nindent 8 }}
        - name: ZOE_ENGINE_BASE_PORT
          value: {{ $w.enginePort | quote }}
        {{- if ne $w.modelCache.type "none" }}
        - name: HF_HOME
          value: {{ $w.modelCache.mountPath | quote }}
        {{- end }}
        {{- if $w.hfToken.secretName }}
        - name: HF_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ $w.hfToken.secretName }}
              key: {{ $w.hfToken.secretKey }}
        {{- end }}
        {{- with $w.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      resources:
        requests:
          {{- with $w.resources.requests }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
          {{ $w.gpuResourceName }}: {{ $w.gpusPerNode | quote }}
          {{- if $w.rdma.enabled }}
          {{- range $name, $count := $w.rdma.resources }}
          {{ $name }}: {{ $count | quote }}
          {{- end }}
          {{- end }}
        limits:
          {{- with $w.resources.limits }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
          {{ $w.gpuResourceName }}: {{ $w.gpusPerNode | quote }}
          {{- if $w.rdma.enabled }}
          {{- range $name, $count := $w.rdma.resources }}
          {{ $name }}: {{ $count | quote }}
          {{- end }}
          {{- end }}
      {{- if $w.rdma.enabled }}
      securityContext:
        capabilities:
          add: ["IPC_LOCK"]
      {{- end }}
      volumeMounts:
        - {name: dshm, mountPath: /dev/shm}
        {{- if ne $w.modelCache.type "none" }}
        - {name: model-cache, mountPath: {{ $w.modelCache.mountPath }}}
        {{- end }}
  volumes:
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $w.shmSize }}
    {{- if eq $w.modelCache.type "hostPath" }}
    - name: model-cache
      hostPath:
        path: {{ $w.modelCache.hostPath }}
        type: DirectoryOrCreate
    {{- else if eq $w.modelCache.type "pvc" }}
    - name: model-cache
      persistentVolumeClaim:
        claimName: {{ $w.modelCache.claimName }}
    {{- else if eq $w.modelCache.type "emptyDir" }}
    - name: model-cache
      emptyDir: {}
    {{- end }}
{{- end -}}

{{/* `zoe deploy`'s arguments, one YAML list item each. The engine is always explicit: the Ray cluster may not
have its GPU workers yet when the RayJob runs, and zoe deploy would then pick the simulated engine. */}}
{{- define "zoe.deployArgs" -}}
{{- $m := .Values.model -}}
- {{ $m.name | quote }}
{{- if $m.variant }}
- --variant
- {{ $m.variant | quote }}
{{- else }}
- --concurrency
- {{ $m.targetConcurrency | quote }}
{{- end }}
- --replicas
- {{ $m.replicas | quote }}
- --engine
- {{ include "zoe.engine" . | quote }}
- --policy
- {{ include "zoe.routerPolicy" . | quote }}
{{- if .Values.router.kvEvents }}
- --kv-events
{{- end }}
{{- with .Values.switching.candidates }}
- --switch
- {{ join "," . | quote }}
{{- end }}
{{- range .Values.switching.classes }}
- --switch-class
- {{ printf "%s:%v:%v" .name .ttftS .itlS | quote }}
{{- end }}
{{- if and (not .Values.rayCluster.existingCluster) (ne (include "zoe.engine" .) "sim") }}
{{- $known := include "zoe.workerImages" . | fromJson }}
{{- range (include "zoe.deploymentImages" . | fromJsonArray) }}
- --image-resource
- {{ printf "%s=%s" . (get $known .).base | quote }}
{{- end }}
{{- end }}
{{- range .Values.controller.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The RayJob's entrypoint: `zoe deploy` with each argument single-quoted for the shell Ray runs it in (a quote
inside one closes the quoting, adds an escaped quote and reopens it). */}}
{{- define "zoe.deployEntrypoint" -}}
zoe deploy
{{- range (include "zoe.deployArgs" . | fromYamlArray) }} {{ printf "'%s'" (toString . | replace "'" "'\\''") }}{{ end -}}
{{- end -}}

{{/* ---------- Pod template: router (OpenAI API; membership pushed by the controller). ---------- */}}
{{- define "zoe.routerPodTemplate" -}}
{{- $r := .Values.router -}}
metadata:
  labels:
    {{- include "zoe.componentLabels" (dict "ctx" . "component" "router") | nindent 4 }}
  annotations:
    checksum/auth: {{ include (print $.Template.BasePath "/secret.yaml") . | sha256sum }}
    {{- with $r.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- include "zoe.podCommon" . | nindent 2 }}
  {{- /* SIGTERM drains (zoe_cluster.router.drain): the kubelet's SIGKILL must come after the delay and the wait */}}
  terminationGracePeriodSeconds: {{ add (int $r.drain.delaySeconds) (int $r.drain.timeoutSeconds) 5 }}
  {{- with $r.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $r.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  affinity:
    {{- if $r.affinity }}
    {{- toYaml $r.affinity | nindent 4 }}
    {{- else }}
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector:
              matchLabels:
                {{- include "zoe.selectorLabels" (dict "ctx" . "component" "router") | nindent 16 }}
    {{- end }}
  containers:
    - name: router
      image: {{ include "zoe.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command: ["zoe", "router"]
      args:
        - --host
        - "0.0.0.0"
        - --port
        - {{ $r.port | quote }}
        - --policy
        - {{ include "zoe.routerPolicy" . | quote }}
        {{- with .Values.switching.classes }}
        {{- /* the slo filter with the limits the controller gives its own router (zoe router --slo-class) */}}
        - --slo-model
        - {{ $.Values.model.name | quote }}
        - --slo-variants
        - {{ join "," $.Values.switching.candidates | quote }}
        {{- range . }}
        - --slo-class
        - {{ printf "%s:%v:%v" .name .ttftS .itlS | quote }}
        {{- end }}
        {{- end }}
        {{- range $r.models }}
        - --model
        - {{ . | quote }}
        {{- end }}
        {{- if $r.persistMembership }}
        - --membership-file
        - /var/lib/zoe-router/membership.json
        {{- end }}
        {{- if $r.pullPicture }}
        {{- /* the headless Service resolves to every ready router pod: a starting pod is not ready, so not itself */}}
        - --picture-peers
        - {{ printf "http://%s-router-peers.%s.svc:%v" (include "zoe.fullname" .) .Release.Namespace $r.port | quote }}
        - --picture-share-s
        - {{ $r.pictureShareSeconds | quote }}
        {{- end }}
        - --drain-delay-s
        - {{ $r.drain.delaySeconds | quote }}
        - --drain-timeout-s
        - {{ $r.drain.timeoutSeconds | quote }}
        {{- range $r.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      ports:
        - {name: http, containerPort: {{ $r.port }}}
      env:
        {{- include "zoe.commonEnv" . | nindent 8 }}
        {{- if .Values.auth.enabled }}
        - name: ZOE_ROUTER_API_KEYS
          valueFrom:
            secretKeyRef:
              name: {{ include "zoe.secretName" . }}
              key: {{ .Values.auth.apiKeysKey }}
        {{- end }}
        {{- with $r.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      readinessProbe:
        httpGet: {path: /health, port: http}
        periodSeconds: 5
      livenessProbe:
        httpGet: {path: /health, port: http}
        periodSeconds: 10
        failureThreshold: 6
      resources:
        {{- toYaml $r.resources | nindent 8 }}
      securityContext:
        allowPrivilegeEscalation: false
        runAsNonRoot: true
        runAsUser: 10001
      {{- if $r.persistMembership }}
      volumeMounts:
        - {name: membership, mountPath: /var/lib/zoe-router}
  {{- /* an emptyDir outlives a container restart (a crashed router comes back with its membership), not the pod */}}
  volumes:
    - name: membership
      emptyDir: {}
      {{- end }}
{{- end -}}

{{/* The routing policy of the controller's router and the router pods: with service classes, the class-aware
`slo` filter (around `prefix`), which counts requests per class for the switcher. */}}
{{- define "zoe.routerPolicy" -}}
{{- if .Values.switching.classes }}slo{{ else }}{{ .Values.router.policy }}{{ end -}}
{{- end -}}

{{/* Rules that span several values; each failure names the keys to change. */}}
{{- define "zoe.validate" -}}
{{- $a := .Values.auth -}}
{{- if and (not $a.enabled) $a.apiKeys -}}
{{- fail "auth.apiKeys are given but auth.enabled is false: the router would ignore them; set auth.enabled=true or drop the keys" -}}
{{- end -}}
{{- if and $a.existingSecret (or $a.apiKeys $a.adminToken) -}}
{{- fail "auth.existingSecret is set together with auth.apiKeys/auth.adminToken: keys come from one place; put them in the Secret or leave existingSecret empty" -}}
{{- end -}}
{{- $ra := .Values.router.autoscaling -}}
{{- if and $ra.enabled (gt (int $ra.minReplicas) (int $ra.maxReplicas)) -}}
{{- fail (printf "router.autoscaling.minReplicas (%d) is above router.autoscaling.maxReplicas (%d)" (int $ra.minReplicas) (int $ra.maxReplicas)) -}}
{{- end -}}
{{- $sw := .Values.switching -}}
{{- if and $sw.classes (or (lt (len $sw.candidates) 2) (gt (len $sw.candidates) 4)) -}}
{{- fail (printf "switching.classes needs 2 to 4 switching.candidates (the variants the mix is made of), got %d" (len $sw.candidates)) -}}
{{- end -}}
{{- if and $sw.classes (not (has .Values.router.policy (list "prefix" "slo"))) -}}
{{- fail (printf "switching.classes runs the slo filter around prefix on every router; router.policy %s cannot be combined with it (set router.policy=prefix)" .Values.router.policy) -}}
{{- end -}}
{{- $w := .Values.rayCluster.worker -}}
{{- if and (eq $w.modelCache.type "pvc") (not $w.modelCache.claimName) -}}
{{- fail "rayCluster.worker.modelCache.type is pvc but rayCluster.worker.modelCache.claimName is empty" -}}
{{- end -}}
{{- if hasKey $w.rayStartParams "resources" -}}
{{- fail "rayCluster.worker.rayStartParams.resources: the chart declares each worker group's Ray resources (zoe-image/<image>); put more in rayCluster.worker.customResources" -}}
{{- end -}}
{{- $images := include "zoe.deploymentImages" . | fromJsonArray -}}
{{- range $image := keys $w.replicasByImage | sortAlpha -}}
{{- if not (has $image $images) -}}
{{- fail (printf "rayCluster.worker.replicasByImage.%s: this deployment of %s runs no variant in that image (its worker images: %s)" $image $.Values.model.name (join ", " $images)) -}}
{{- end -}}
{{- end -}}
{{- $engine := include "zoe.engine" . -}}
{{- if and (not .Values.rayCluster.existingCluster) (ne $engine "sim") -}}
{{- with .Values.model.variant -}}
{{- $image := (get (get (include "zoe.recipes" $ | fromJson) $.Values.model.name) .).image -}}
{{- if lt (int (include "zoe.imageReplicas" (dict "ctx" $ "image" $image))) 1 -}}
{{- fail (printf "model.variant %s runs in worker image %s, whose worker group has 0 nodes: set rayCluster.worker.replicasByImage.%s" . $image $image) -}}
{{- end -}}
{{- end -}}
{{- $nodes := 0 -}}
{{- range $images }}{{ $nodes = add $nodes (include "zoe.imageReplicas" (dict "ctx" $ "image" .)) }}{{ end -}}
{{- if lt (int $nodes) 1 -}}
{{- fail (printf "rayCluster.worker.replicas is 0 (and replicasByImage adds none) but %s runs on %s: GPU engines need MI355X worker nodes (or use model.engine=sim)" .Values.model.name $engine) -}}
{{- end -}}
{{- end -}}
{{- end -}}
