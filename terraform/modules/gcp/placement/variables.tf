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

variable "region" {
  description = "Region of the zone."
  type        = string
}

variable "zone" {
  description = "The VMs' zone; names the policy (a compact policy places VMs close together in one zone)."
  type        = string
  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z0-9]+$", var.zone)) && length(var.zone) <= 25
    error_message = "zone: a GCP zone name of at most 25 characters, e.g. us-central1-a."
  }
}

variable "enabled" {
  description = "Create a compact placement policy (spec placement: cluster)."
  type        = bool
  default     = true
}
