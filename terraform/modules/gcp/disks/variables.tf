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

variable "labels" {
  description = "Labels for every resource (kit-cluster etc.)."
  type        = map(string)
  default     = {}
}

variable "nodes" {
  description = "Number of nodes (node rank = index)."
  type        = number
  validation {
    condition     = var.nodes >= 1 && floor(var.nodes) == var.nodes
    error_message = "nodes must be a whole number >= 1."
  }
}

variable "zone" {
  description = "The cluster's zone (disks attach only within their zone)."
  type        = string
}

variable "size_gb" {
  description = "Size of each data disk in GB."
  type        = number
  validation {
    condition     = var.size_gb > 0
    error_message = "size_gb must be positive."
  }
}

variable "disk_type" {
  description = "Persistent disk type."
  type        = string
  default     = "pd-balanced"
  validation {
    condition     = contains(["pd-balanced", "pd-ssd", "pd-standard", "hyperdisk-balanced"], var.disk_type)
    error_message = "disk_type must be pd-balanced, pd-ssd, pd-standard or hyperdisk-balanced."
  }
}

variable "kms_key_self_link" {
  description = "Cloud KMS key for the disks (null: Google-managed encryption, always on)."
  type        = string
  default     = null
}

variable "name_suffix" {
  description = "Appended to the cluster name in the disks' names: one set of disks per zone and shape of a job that moves (\"\" for a job that does not)."
  type        = string
  default     = ""
  validation {
    condition     = can(regex("^(-[a-z0-9]{1,8})?$", var.name_suffix))
    error_message = "name_suffix: empty, or '-' and up to 8 lowercase letters or digits."
  }
}
