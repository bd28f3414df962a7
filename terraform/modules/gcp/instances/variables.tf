variable "cluster_name" {
  description = "kit cluster name; prefix of every resource name."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}$", var.cluster_name))
    error_message = "cluster_name: a lowercase letter, then up to 30 lowercase letters, digits or '-'."
  }
}

variable "project" {
  description = "GCP project id."
  type        = string
}

variable "zone" {
  description = "The one zone every node (and its data disk) lives in."
  type        = string
}

variable "nodes" {
  description = "Number of nodes (node rank = index)."
  type        = number
  validation {
    condition     = var.nodes >= 1 && floor(var.nodes) == var.nodes
    error_message = "nodes must be a whole number >= 1."
  }
}

variable "machine_type" {
  description = "Machine type, e.g. a3-highgpu-1g (GPUs included) or n1-standard-8 (+ guest accelerator)."
  type        = string
}

variable "market" {
  description = "spot or on-demand. Only this decides the scheduling block."
  type        = string
  validation {
    condition     = contains(["spot", "on-demand"], var.market)
    error_message = "market must be spot or on-demand."
  }
}

variable "guest_accelerator" {
  description = "Accelerator to attach for N1 machine types (null: the machine type carries its GPUs)."
  type = object({
    type  = string
    count = number
  })
  default = null
}

variable "image" {
  description = "Boot image (self link, family path or name)."
  type        = string
  default     = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550"
}

variable "boot_disk_size_gb" {
  description = "Boot disk size in GB."
  type        = number
  default     = 100
  validation {
    condition     = var.boot_disk_size_gb >= 10
    error_message = "boot_disk_size_gb must be at least 10."
  }
}

variable "network" {
  description = "Network name or self link."
  type        = string
  default     = "default"
}

variable "subnetwork" {
  description = "Subnetwork name or self link (null: the network's subnetwork in the region, auto mode)."
  type        = string
  default     = null
}

variable "nic_type" {
  description = "GVNIC or VIRTIO_NET (null: the provider's default); A3 machine types need GVNIC."
  type        = string
  default     = null
  validation {
    condition     = var.nic_type == null ? true : contains(["GVNIC", "VIRTIO_NET"], var.nic_type)
    error_message = "nic_type must be GVNIC, VIRTIO_NET or null."
  }
}

variable "os_login" {
  description = "Log in with OS Login (the users' Google identities) instead of the ssh-keys metadata key."
  type        = bool
  default     = false
}

variable "resource_policy" {
  description = "Compact placement policy self link (null: none)."
  type        = string
  default     = null
}

variable "ssh_user" {
  description = "Login user created from the ssh-keys metadata."
  type        = string
  default     = "ubuntu"
}

variable "ssh_public_key" {
  description = "OpenSSH public key (content) for ssh_user; unused with os_login."
  type        = string
  default     = ""
}

variable "allowed_cidrs" {
  description = "IPv4 CIDRs that may reach SSH (22/tcp)."
  type        = list(string)
  validation {
    condition     = length(var.allowed_cidrs) > 0 && alltrue([for c in var.allowed_cidrs : can(cidrhost(c, 0))])
    error_message = "allowed_cidrs must be a non-empty list of CIDRs."
  }
}

variable "disk_ids" {
  description = "Data disk self links in node-rank order (from the disks root module)."
  type        = list(string)
}

variable "labels" {
  description = "Labels for every resource (kit-cluster etc.)."
  type        = map(string)
  default     = {}
}

variable "checkpoint_bucket" {
  description = "GCS bucket the nodes copy checkpoints to (null: none; the VMs get no service account)."
  type        = string
  default     = null
}
