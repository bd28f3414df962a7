variable "cluster_name" {
  description = "kit cluster name; names the placement group."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}$", var.cluster_name))
    error_message = "cluster_name: a lowercase letter, then up to 30 lowercase letters, digits or '-'."
  }
}

variable "enabled" {
  description = "Create a cluster placement group (spec placement: cluster)."
  type        = bool
  default     = true
}

variable "tags" {
  description = "Tags for every resource (kit:cluster etc.)."
  type        = map(string)
  default     = {}
}
